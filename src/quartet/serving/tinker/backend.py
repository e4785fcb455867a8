"""The local backend: one LoRA training model per `create_model`, on this process's CPU (or device).

The model is built by quartet's engine builder (`engines.model_init.build_model`: a local folder, LoRA
adapters through peft, float32 weights), so what is trained is what `quartet train` would train. Tinker
splits a step in two calls, which `TrainingEngine.train_step` does in one: `forward_backward` here only
accumulates gradients, and `optim_step` applies torch's AdamW with the AdamParams of that call (each call
may change the learning rate), then clears the gradients.

Losses: `cross_entropy` (the Tinker docs' definition: the sum over target tokens of
-weights * logprob(target), with the per-token `logprobs` returned). Other losses raise `NotServedError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quartet.config.model import Dtype, LoraConfig
from quartet.config.optim import OptimConfig
from quartet.engines.model_init import build_model
from quartet.engines.spec import EngineSpec
from quartet.serving.tinker.wire import Datum, WireError

__all__ = ["AdamStep", "LoraModel", "NotServedError", "lora_spec"]

_ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


class NotServedError(Exception):
    """A call or option the service does not serve yet; the message names it."""


@dataclasses.dataclass(frozen=True)
class AdamStep:
    """The SDK's AdamParams (its defaults)."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


def lora_spec(model_path: str | Path, rank: int, seed: int, train_attn: bool, train_mlp: bool) -> EngineSpec:
    """The engine spec of a Tinker LoRA model: float32 (no autocast), adapters on the chosen linears.

    The test builds the same spec to compute the expected numbers independently of the service.
    """
    targets = (_ATTN if train_attn else ()) + (_MLP if train_mlp else ())
    if rank <= 0 or not targets:
        raise WireError("lora_config", "rank must be > 0 and train_attn or train_mlp true")
    lora = LoraConfig(rank=rank, alpha=rank, target_modules=targets)  # alpha = rank: scale 1
    return EngineSpec(
        str(model_path), mixed_precision=Dtype.FLOAT32, optim=OptimConfig(), lora=lora, seed=seed
    )


class LoraModel:
    """One training client's model: forward_backward accumulates, optim_step updates and clears."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self.module = build_model(spec)
        self.module.train()
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4)
        self.steps = 0
        head: Any = self.module.get_output_embeddings()  # type: ignore[operator]
        self.vocab_size = int(head.weight.shape[0])

    def check(self, loss_fn: str, data: Sequence[Datum]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (targets, weights) of each datum; raises `WireError` naming the field of a malformed one and
        `NotServedError` for a loss not served yet. Cheap: the server calls it before queueing a request."""
        if loss_fn != "cross_entropy":
            raise NotServedError(f"loss_fn {loss_fn!r} is not served yet (served: cross_entropy)")
        if not data:
            raise WireError("data", "no datums")
        checked = []
        for i, datum in enumerate(data):
            targets, weights = _cross_entropy_inputs(datum, i)
            for name, ids in (
                ("model_input", torch.as_tensor(datum.tokens)),
                ("loss_fn_inputs.target_tokens", targets),
            ):
                if int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
                    raise WireError(f"data[{i}].{name}", f"token ids must lie in [0, {self.vocab_size})")
            checked.append((targets, weights))
        return checked

    def forward_backward(
        self, loss_fn: str, data: Sequence[Datum], forward_only: bool
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum outputs (`logprobs` of the target tokens) and metrics (`loss:sum`); grads accumulate."""
        outputs: list[dict[str, np.ndarray]] = []
        total = torch.zeros((), dtype=torch.float64)
        for datum, (targets, weights) in zip(data, self.check(loss_fn, data), strict=True):
            with torch.set_grad_enabled(not forward_only):
                logits = self.module(input_ids=torch.as_tensor(datum.tokens)[None]).logits[0].float()
                logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
                loss = -(logprobs * weights).sum()
                if not forward_only:
                    torch.autograd.backward(loss)
            total += loss.detach().double()
            outputs.append({"logprobs": logprobs.detach().numpy()})
        return outputs, {"loss:sum": float(total)}

    def optim_step(self, adam: AdamStep) -> dict[str, float]:
        """AdamW with `adam`'s settings over the accumulated gradients; then the gradients are cleared."""
        for group in self.optimizer.param_groups:
            group.update(
                lr=adam.learning_rate,
                betas=(adam.beta1, adam.beta2),
                eps=adam.eps,
                weight_decay=adam.weight_decay,
            )
        norm = _grad_norm(self.params)
        if adam.grad_clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.params, adam.grad_clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.steps += 1
        return {"grad_norm:mean": norm}

    # ---- checkpoints (issue 51): the adapter and the AdamW state, keyed by adapter-free names ----------

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Copies of (adapter state, optimizer state) to save.

        The adapter's keys are peft's adapter-free names (`...q_proj.lora_A.weight`), so a checkpoint
        loads into any adapter slot. The optimizer state is torch's `state_dict` with each parameter index
        replaced by that key (independent of parameter order), plus `steps`.
        """
        keys = self._adapter_keys()
        adapter = {k: p.detach().clone() for k, p in zip(keys, self.params, strict=True)}
        saved = self.optimizer.state_dict()
        per_param = {keys[i]: {n: _copy(v) for n, v in s.items()} for i, s in saved["state"].items()}
        groups = [
            {**{n: v for n, v in g.items() if n != "params"}, "params": [keys[i] for i in g["params"]]}
            for g in saved["param_groups"]
        ]
        return adapter, {"state": per_param, "param_groups": groups, "steps": self.steps}

    def load(self, adapter: Mapping[str, torch.Tensor], optimizer_state: Mapping[str, Any] | None) -> None:
        """Set the adapter (bitwise) and the optimizer: restored from `optimizer_state`, or fresh when None
        (the SDK's load_state without optimizer resets it). Pending gradients are dropped. A checkpoint that
        does not fit raises `WireError("path")` before anything changes."""
        keys = self._adapter_keys()
        if set(adapter) != set(keys):
            missing, extra = sorted(set(keys) - set(adapter)), sorted(set(adapter) - set(keys))
            raise WireError(
                "path", f"the checkpoint's adapter does not fit: missing {missing[:2]}, extra {extra[:2]}"
            )
        for key, param in zip(keys, self.params, strict=True):
            if adapter[key].shape != param.shape:
                raise WireError("path", f"{key}: shape {list(adapter[key].shape)} != {list(param.shape)}")
        optimizer = torch.optim.AdamW(self.params, lr=1e-4)
        if optimizer_state is not None:
            index = {k: i for i, k in enumerate(keys)}
            try:
                groups = [
                    {**g, "params": [index[k] for k in g["params"]], "betas": tuple(g["betas"])}
                    for g in optimizer_state["param_groups"]
                ]
                per_param = {index[k]: dict(v) for k, v in optimizer_state["state"].items()}
                optimizer.load_state_dict({"state": per_param, "param_groups": groups})
            except (KeyError, ValueError, TypeError) as err:
                raise WireError("path", f"the checkpoint's optimizer state does not fit: {err!r}") from err
        with torch.no_grad():
            for key, param in zip(keys, self.params, strict=True):
                param.copy_(adapter[key])
                param.grad = None
        self.optimizer = optimizer
        self.steps = int(optimizer_state.get("steps", 0)) if optimizer_state is not None else 0

    def _adapter_keys(self) -> list[str]:
        """The names of `self.params`, without the peft adapter's name (peft's saved-adapter keys)."""
        name = str(getattr(self.module, "active_adapter", "default"))
        trained = [n for n, p in self.module.named_parameters() if p.requires_grad]
        return [n.replace(f".{name}.", ".") for n in trained]


def _copy(value: Any) -> Any:
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _grad_norm(params: Sequence[torch.nn.Parameter]) -> float:
    grads = [p.grad.detach().double().norm() for p in params if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


def _cross_entropy_inputs(datum: Datum, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`target_tokens` (int64) and `weights` (float32, default ones), one per input token."""
    inputs: Mapping[str, Any] = datum.loss_fn_inputs
    field = f"data[{index}].loss_fn_inputs"
    if "target_tokens" not in inputs:
        raise WireError(f"{field}.target_tokens", "missing (cross_entropy needs target_tokens)")
    targets = torch.as_tensor(np.asarray(inputs["target_tokens"]).reshape(-1).astype(np.int64))
    n = datum.tokens.size
    if targets.numel() != n:
        raise WireError(f"{field}.target_tokens", f"holds {targets.numel()} tokens for {n} input tokens")
    raw = inputs.get("weights")
    weights = torch.ones(n) if raw is None else torch.as_tensor(np.asarray(raw, dtype=np.float32).reshape(-1))
    if weights.numel() != n:
        raise WireError(f"{field}.weights", f"holds {weights.numel()} values for {n} input tokens")
    return targets, weights
