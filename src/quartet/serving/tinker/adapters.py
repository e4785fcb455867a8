"""Many LoRA adapters on one shared base model: the `AdapterHost` behind the Tinker service.

One host holds one base model (a local transformers folder, float32, frozen) and a peft model over it
with one named adapter per training client (and one per loaded sampler checkpoint). Only adapter weights
are ever added, copied or loaded: the base weights are never merged or duplicated, so a service with N
clients on one base holds one copy of the base and N small adapters.

Isolation: each adapter has its own parameters (peft keeps them in per-name submodules) and its own
AdamW; a call runs with exactly its adapter active (`peft`'s `set_adapter`), so a gradient only reaches
the active adapter's parameters and an optimizer only steps its own.

Not thread-safe by design: the service runs every call of a host on that host's one thread
(`queues.FairQueues`), which is what makes adapter switching safe.

The init of a new adapter depends only on its seed (the global RNG is seeded right before peft builds
it), so a client's first adapter equals `reference_model(...)` built alone with the same settings.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quartet.models.loading import load_causal_lm
from quartet.serving.tinker.sampling import context_length, eos_token_ids, vocab_size

__all__ = ["BASE", "AdamStep", "AdapterHost", "AdapterSpec", "reference_model"]

BASE = "__base__"
"""The name `active` takes for "no adapter" (the bare base model); peft's own word for it."""

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_UNEMBED = ("lm_head",)


@dataclasses.dataclass(frozen=True)
class AdapterSpec:
    """A client's LoRA settings, as `create_lora_training_client` sends them (alpha = rank: scale 1)."""

    rank: int
    seed: int = 0
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 < self.rank <= 1024:
            raise ValueError("lora_config.rank: must be an integer in [1, 1024]")
        if not self.target_modules:
            raise ValueError("lora_config: at least one of train_attn, train_mlp, train_unembed must be true")

    @property
    def target_modules(self) -> tuple[str, ...]:
        """The linear layers that get adapters."""
        return (
            (_ATTN if self.train_attn else ())
            + (_MLP if self.train_mlp else ())
            + (_UNEMBED if self.train_unembed else ())
        )

    def peft_config(self) -> Any:
        """The `peft.LoraConfig` of this spec: no dropout (a Tinker step is deterministic)."""
        import peft

        return peft.LoraConfig(
            r=self.rank, lora_alpha=self.rank, lora_dropout=0.0, target_modules=list(self.target_modules)
        )


@dataclasses.dataclass(frozen=True)
class AdamStep:
    """The SDK's AdamParams (its defaults)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclasses.dataclass
class _Adapter:
    spec: AdapterSpec
    params: list[nn.Parameter]
    keys: list[str]  # the params' names without the adapter's name
    optimizer: torch.optim.AdamW | None  # None: a sampler adapter (frozen)
    steps: int = 0


def _load_base(model_path: str | Path) -> nn.Module:
    module = load_causal_lm(model_path)
    module.config.use_cache = False
    module.requires_grad_(False)
    return module


def reference_model(model_path: str | Path, spec: AdapterSpec, name: str = "default") -> nn.Module:
    """A stand-alone peft model with one adapter initialised exactly as the host initialises `spec`'s.

    Tests compute expected numbers on it, independently of the service.
    """
    import peft

    base = _load_base(model_path)
    torch.manual_seed(spec.seed)
    with _quiet_tied_head():
        model: nn.Module = peft.get_peft_model(base, spec.peft_config(), adapter_name=name)
    return model


@contextmanager
def _quiet_tied_head() -> Iterator[None]:
    """peft warns when an adapter sits on a head tied to the embeddings: that matters only when merging,
    which this service never does (the head's adapter changes the output projection, not the input)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        yield


class AdapterHost:
    """One frozen base model and its named LoRA adapters (see the module doc)."""

    def __init__(self, model_path: str | Path, device: str = "auto") -> None:
        self.model_path = Path(model_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)  # the adapters peft adds follow their base layers there
        self._base = _load_base(model_path).to(self.device)
        self._peft: Any = None  # the PeftModel, built with the first adapter
        self._adapters: dict[str, _Adapter] = {}
        self.vocab_size = vocab_size(self._base)
        self.context = context_length(self._base)
        self.eos_ids = eos_token_ids(self._base)
        self._tokenizer: Any = None

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids as text with the model folder's tokenizer (loaded on first use): stop strings."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_path), local_files_only=True)
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))

    # ---- adapters -----------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        """The adapters held, in the order they were added."""
        return list(self._adapters)

    def spec(self, name: str) -> AdapterSpec:
        """The settings adapter `name` was created with."""
        return self._get(name).spec

    def steps(self, name: str) -> int:
        """How many optimizer steps adapter `name` has taken."""
        return self._get(name).steps

    def add(self, name: str, spec: AdapterSpec, trainable: bool = True) -> None:
        """A new adapter initialised from `spec.seed` (LoRA B = 0: it starts as the base model)."""
        import peft

        if name in self._adapters or name == BASE:
            raise ValueError(f"adapter {name!r} exists")
        torch.manual_seed(spec.seed)
        with _quiet_tied_head():
            if self._peft is None:
                self._peft = peft.get_peft_model(self._base, spec.peft_config(), adapter_name=name)
                self._peft.eval()  # no dropout anywhere: train and eval are the same
            else:
                self._peft.add_adapter(name, spec.peft_config())
        named = [(n, p) for n, p in self._peft.named_parameters() if f".{name}." in n and "lora_" in n]
        params = [p for _, p in named]
        for param in params:
            param.requires_grad_(trainable)
        optimizer = torch.optim.AdamW(params, lr=1e-4) if trainable else None
        keys = [n.replace(f".{name}.", ".") for n, _ in named]
        self._adapters[name] = _Adapter(spec, params, keys, optimizer)

    def remove(self, name: str) -> None:
        """Drop adapter `name` and its optimizer state (the last one stays in peft, inert, until reused)."""
        self._get(name)
        del self._adapters[name]
        if self._adapters:
            self._peft.delete_adapter(name)

    def _get(self, name: str) -> _Adapter:
        adapter = self._adapters.get(name)
        if adapter is None:
            raise KeyError(f"no adapter {name!r} on {self.model_path}")
        return adapter

    @contextmanager
    def active(self, name: str | None) -> Iterator[nn.Module]:
        """The module to call with adapter `name` active (None or `BASE`: the bare base model)."""
        if name is None or name == BASE or self._peft is None:
            if self._peft is None:
                yield self._base
            else:
                with self._peft.disable_adapter():
                    yield self._peft
            return
        adapter = self._get(name)
        self._peft.set_adapter(name)
        # set_adapter marks the active adapter trainable: keep a sampler adapter frozen
        for param in adapter.params:
            param.requires_grad_(adapter.optimizer is not None)
        yield self._peft

    def mixed(self) -> nn.Module | None:
        """The peft model to call with `adapter_names=[one name per row]` (`BASE` for the bare base): each
        row through its own adapter in one forward (peft's mixed batch; eval mode only). None while the
        host has no adapter (every row is the base: use `active(None)`)."""
        return self._peft  # type: ignore[no-any-return]

    # ---- training -----------------------------------------------------------------------------------

    def gradients(self, name: str) -> list[torch.Tensor | None]:
        """A copy of adapter `name`'s accumulated gradients (to put back after a failed request)."""
        return [None if p.grad is None else p.grad.clone() for p in self._get(name).params]

    def set_gradients(self, name: str, grads: Sequence[torch.Tensor | None]) -> None:
        """Put back what `gradients` copied."""
        for param, grad in zip(self._get(name).params, grads, strict=True):
            param.grad = grad

    def optim_step(self, name: str, adam: AdamStep) -> dict[str, float]:
        """AdamW with `adam`'s settings over adapter `name`'s accumulated gradients, which it then clears."""
        adapter = self._get(name)
        if adapter.optimizer is None:
            raise ValueError(f"adapter {name!r} is a sampler adapter: it does not train")
        for group in adapter.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        grads = [p.grad.detach().double().norm() for p in adapter.params if p.grad is not None]
        norm = float(torch.stack(grads).norm()) if grads else 0.0
        if adam.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(adapter.params, adam.grad_clip_norm)
        adapter.optimizer.step()
        adapter.optimizer.zero_grad(set_to_none=True)
        adapter.steps += 1
        return {"grad_norm:mean": norm}

    # ---- state ------------------------------------------------------------------------------------

    def keys(self, name: str) -> list[str]:
        """The names of adapter `name`'s parameters without the adapter's name (peft's saved form, e.g.
        `...q_proj.lora_A.weight`): a checkpoint loads into any adapter of the same settings."""
        return list(self._get(name).keys)

    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """Copies of adapter `name`'s weights, by `keys`, on the CPU."""
        adapter = self._get(name)
        return {k: p.detach().cpu().clone() for k, p in zip(adapter.keys, adapter.params, strict=True)}

    def load_adapter_state(self, name: str, state: Mapping[str, torch.Tensor]) -> None:
        """Put `state` (as `adapter_state` gives it) into adapter `name`, bitwise; pending gradients are
        dropped. ValueError naming the misfit (keys, shapes) before anything changes."""
        adapter = self._get(name)
        if set(adapter.keys) != set(state):
            missing, extra = sorted(set(adapter.keys) - set(state)), sorted(set(state) - set(adapter.keys))
            raise ValueError(f"the adapter weights do not fit: missing {missing[:2]}, unexpected {extra[:2]}")
        for key, param in zip(adapter.keys, adapter.params, strict=True):
            if tuple(state[key].shape) != tuple(param.shape):
                raise ValueError(f"{key}: shape {list(state[key].shape)}, expected {list(param.shape)}")
        with torch.no_grad():
            for key, param in zip(adapter.keys, adapter.params, strict=True):
                param.copy_(state[key])
                param.grad = None

    def optimizer_state(self, name: str) -> dict[str, Any]:
        """Adapter `name`'s AdamW state: torch's `state_dict` with each parameter index replaced by its key
        (independent of parameter order), plus `steps`."""
        adapter = self._get(name)
        if adapter.optimizer is None:
            raise ValueError(f"adapter {name!r} is a sampler adapter: it has no optimizer")
        keys = adapter.keys
        saved = adapter.optimizer.state_dict()
        per_param = {keys[i]: {n: _copy(v) for n, v in st.items()} for i, st in saved["state"].items()}
        groups = [
            {**{n: v for n, v in g.items() if n != "params"}, "params": [keys[i] for i in g["params"]]}
            for g in saved["param_groups"]
        ]
        return {"state": per_param, "param_groups": groups, "steps": adapter.steps}

    def load_state(
        self, name: str, weights: Mapping[str, torch.Tensor], optimizer_state: Mapping[str, Any] | None
    ) -> None:
        """The adapter's weights (bitwise) and its optimizer: restored from `optimizer_state`, or fresh when
        None (the SDK's load_state without optimizer resets it). ValueError before anything changes if
        either does not fit."""
        adapter = self._get(name)
        optimizer = torch.optim.AdamW(adapter.params, lr=1e-4)
        if optimizer_state is not None:
            index = {k: i for i, k in enumerate(adapter.keys)}
            try:
                groups = [
                    {**g, "params": [index[k] for k in g["params"]], "betas": tuple(g["betas"])}
                    for g in optimizer_state["param_groups"]
                ]
                per_param = {index[k]: dict(v) for k, v in optimizer_state["state"].items()}
                optimizer.load_state_dict({"state": per_param, "param_groups": groups})
            except (KeyError, ValueError, TypeError) as err:
                raise ValueError(f"the optimizer state does not fit: {err!r}") from err
        self.load_adapter_state(name, weights)
        adapter.optimizer = optimizer
        adapter.steps = int(optimizer_state.get("steps", 0)) if optimizer_state is not None else 0


def _copy(value: Any) -> Any:
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
