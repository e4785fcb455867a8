"""Engine state: in memory, as a sharded checkpoint folder, and as a consolidated Hugging Face export.

State = model parameters, AdamW moments, scheduler position, torch RNG state, and the engine's counters.
With FSDP2 the model and optimizer entries are sharded (DTensors, torch.distributed.checkpoint's
`get_state_dict` format, keyed by parameter names); with one rank they are plain tensors.

Checkpoint folder layout (every rank calls `save_checkpoint` with the same folder):
    dcp/                 torch.distributed.checkpoint of {"model", "optimizer"}: each rank writes its shards;
                         it can be loaded on a different world size (DCP reshards on load)
    extra_rank{r}.pt     scheduler, RNG state and counters of rank r (torch.save); on another world size a
                         rank without its file follows `quartet.engines.elastic` (saved rank 0's scheduler
                         and counters, an RNG seeded from (seed, step, rank))
Writing into a temporary folder and renaming it is the caller's job (the trainer does it for the whole
checkpoint).

An optimizer that has not stepped yet has no state; it is saved as absent, not initialised: torch's state
dict helpers would initialise it by a zero-gradient step, which sets AdamW's step counter to 1 and would
change the first real update.

The HF export gathers the full state dict (a collective), and rank 0 writes a transformers folder that
`from_pretrained` loads: the model is re-created from its config on the meta device (no memory, no init),
the gathered weights are assigned into it, LoRA adapters are merged into the base weights, and tokenizer
files are copied from the source folder.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.optim.lr_scheduler import LambdaLR
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PreTrainedModel,
)

from quartet.engines.dist import DistContext
from quartet.engines.elastic import derived_seed, describe_change, elastic_source
from quartet.engines.hf_modules import hf_model
from quartet.engines.spec import EngineSpec, ModelKind
from quartet.models.vision import is_vision_module

__all__ = ["TOKENIZER_FILES", "export_hf", "load_checkpoint", "restore_state", "save_checkpoint", "snapshot"]

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "preprocessor_config.json",  # a vision-language model's image processor
    "processor_config.json",
)

log = logging.getLogger(__name__)


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def snapshot(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: LambdaLR | None,
    counters: dict[str, int],
    device: torch.device,
) -> dict[str, Any]:
    """This rank's state. Model and optimizer tensors are REFERENCES to live storage: clone to keep them."""
    state: dict[str, Any] = {
        "model": get_model_state_dict(module),
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "rng": _rng_state(device),
        "counters": dict(counters),
    }
    if optimizer is not None and optimizer.state:
        state["optimizer"] = get_optimizer_state_dict(module, optimizer)
    return state


def restore_state(
    state: dict[str, Any],
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: LambdaLR | None,
    device: torch.device,
) -> dict[str, int]:
    """Load a `snapshot` into the live objects; returns the saved counters."""
    set_model_state_dict(module, state["model"])
    if optimizer is not None:
        if "optimizer" in state:
            set_optimizer_state_dict(module, optimizer, state["optimizer"])
        else:
            optimizer.state.clear()
    if scheduler is not None and state["scheduler"] is not None:
        scheduler.load_state_dict(state["scheduler"])
    _set_rng_state(state["rng"], device)
    return dict(state["counters"])


@contextmanager
def _single_process_quiet() -> Iterator[None]:
    """DCP warns on every single-process save/load, which the engine does on purpose with one rank."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninit")
        yield


def save_checkpoint(
    folder: str | Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: LambdaLR | None,
    counters: dict[str, int],
    ctx: DistContext,
) -> None:
    """Write this rank's part of the checkpoint into `folder` (all ranks call it; see the module doc)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = snapshot(module, optimizer, scheduler, counters, ctx.device)
    tensors = {k: state.pop(k) for k in ("model", "optimizer") if k in state}
    with _single_process_quiet():
        try:
            dcp_save(tensors, checkpoint_id=str(folder / "dcp"), no_dist=not ctx.sharded)
        except CheckpointException as err:
            raise _write_error(err, folder) from err
    state["has_optimizer_state"] = "optimizer" in tensors
    state["world"] = ctx.world
    torch.save(state, folder / f"extra_rank{ctx.rank}.pt")


def _write_error(err: CheckpointException, folder: Path) -> BaseException:
    """The first rank's own error, named with the folder: torch's CheckpointException says only which
    ranks failed on its first line (`CheckpointException ranks:dict_keys([0])`), and a run's failure line
    is that first line, so a full disk would go unnamed there. An OSError stays an OSError (errno kept)."""
    if not err.failures:
        return err
    rank, (cause, _) = next(iter(sorted(err.failures.items())))
    where = f"writing checkpoint {folder} (rank {rank})"
    if isinstance(cause, OSError) and cause.errno is not None:
        return OSError(cause.errno, f"{cause.strerror}: {where}: {cause.filename or ''}".rstrip(": "))
    return RuntimeError(f"{where}: {type(cause).__name__}: {cause}")


def load_checkpoint(
    folder: str | Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    scheduler: LambdaLR | None,
    ctx: DistContext,
    seed: int = 0,
) -> dict[str, int]:
    """Load what `save_checkpoint` wrote into the live objects; returns the saved counters.

    The checkpoint may come from another world size or layout: the model and optimizer are resharded by
    DCP, and the per-rank extras follow `quartet.engines.elastic` (a rank the checkpoint has no file for
    reads saved rank 0's scheduler and counters, and its RNG is seeded from `(seed, step, rank)`)."""
    folder = Path(folder)
    source = elastic_source(folder, "extra_rank", ctx.rank)
    extra = torch.load(source.path, weights_only=False)
    tensors: dict[str, Any] = {"model": get_model_state_dict(module)}
    if optimizer is not None and extra["has_optimizer_state"]:
        # Gives the optimizer a state to load into (by a zero-lr step); it is overwritten just below.
        tensors["optimizer"] = get_optimizer_state_dict(module, optimizer)
    with _single_process_quiet():
        dcp_load(tensors, checkpoint_id=str(folder / "dcp"), no_dist=not ctx.sharded)
    if not source.own:  # a rank the saved world did not have: its own stream, not a copy of rank 0's
        torch.manual_seed(derived_seed(seed, int(extra["counters"]["steps"]), ctx.rank))
        extra["rng"] = _rng_state(ctx.device)
    change = describe_change(int(extra.get("world", source.saved_world)), ctx.world, "torch RNG")
    if change is not None and ctx.rank == 0:
        log.info("engine checkpoint %s: %s", folder, change)
    return restore_state({**extra, **tensors}, module, optimizer, scheduler, ctx.device)


_AUTO_CLASSES = {
    ModelKind.CAUSAL_LM: AutoModelForCausalLM,
    ModelKind.VALUE: AutoModelForTokenClassification,
    ModelKind.REWARD: AutoModelForSequenceClassification,
}


def _consolidated_model(
    module: nn.Module, spec: EngineSpec, full: dict[str, torch.Tensor]
) -> PreTrainedModel:
    """A fresh transformers model holding the gathered weights `full` (LoRA merged)."""
    config = hf_model(module).config
    vision = is_vision_module(module)
    if vision and spec.kind is ModelKind.VALUE:  # registers the VLM value classes with the Auto class
        import quartet.models.vision_value  # noqa: F401
    with torch.device("meta"):
        vlm = vision and spec.kind is ModelKind.CAUSAL_LM
        auto = AutoModelForImageTextToText if vlm else _AUTO_CLASSES[spec.kind]
        fresh: Any = auto.from_config(config)  # type: ignore[no-untyped-call]
        if spec.uses_lora:
            import peft

            fresh = peft.get_peft_model(fresh, getattr(module, "peft_config")["default"])  # noqa: B009
    fresh.load_state_dict(full, strict=True, assign=True)
    if not spec.uses_lora:
        assert isinstance(fresh, PreTrainedModel)
        fresh.tie_weights()
        return fresh
    tied = bool(getattr(config, "tie_word_embeddings", False))
    with warnings.catch_warnings():
        # peft unties input/output embeddings on merge; they are re-tied below when adapters left them equal.
        warnings.filterwarnings("ignore", message="Input and output embeddings are no longer tied")
        model = fresh.merge_and_unload()
    assert isinstance(model, PreTrainedModel)
    out = model.get_output_embeddings()  # type: ignore[no-untyped-call]
    in_weight, out_weight = model.get_input_embeddings().weight, getattr(out, "weight", None)
    if tied and isinstance(in_weight, torch.Tensor) and isinstance(out_weight, torch.Tensor):
        if not torch.equal(in_weight, out_weight):
            return model  # adapters on the embeddings: they really differ now
        model.config.tie_word_embeddings = True
        model.tie_weights()
    return model


def export_hf(
    folder: str | Path,
    module: nn.Module,
    spec: EngineSpec,
    ctx: DistContext,
    dtype: torch.dtype = torch.float32,
) -> Path | None:
    """Write a consolidated transformers folder (all ranks call it; rank 0 writes). Returns it on rank 0."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = cast(dict[str, torch.Tensor], get_model_state_dict(module, options=options))
    if ctx.rank != 0:
        return None
    # copy=True: with one rank the "full" state dict holds the LIVE parameters, and merging LoRA into them
    # in place would corrupt the engine.
    full = {
        k: v.detach().to("cpu", dtype=dtype if v.is_floating_point() else None, copy=True)
        for k, v in full.items()
    }
    model = _consolidated_model(module, spec, full)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, state_dict=model.state_dict())
    source = Path(spec.model_path)
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, folder / name)
    return folder
