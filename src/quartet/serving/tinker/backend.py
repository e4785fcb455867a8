"""The local backend: one LoRA training model per `create_model`, on this process's CPU (or device).

The model is built by quartet's engine builder (`engines.model_init.build_model`: a local folder, LoRA
adapters through peft, float32 weights), so what is trained is what `quartet train` would train. Tinker
splits a step in two calls, which `TrainingEngine.train_step` does in one: `forward_backward` here only
accumulates gradients, and `optim_step` applies torch's AdamW with the AdamParams of that call (each call
may change the learning rate), then clears the gradients.

Losses: every built-in Tinker loss the docs define (cross_entropy, importance_sampling, ppo, cispo, dro,
gspo), computed by `losses` over the logprobs this model gives each datum's target tokens.
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
from quartet.serving.tinker.losses import LossInputs, check_config, check_inputs, datum_loss, merge_metrics
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

    def check(
        self, loss_fn: str, data: Sequence[Datum], config: Mapping[str, float | str] | None = None
    ) -> tuple[dict[str, float], list[LossInputs]]:
        """`loss_fn`'s resolved config and each datum's checked inputs (`losses.check_config` /
        `check_inputs`); raises `WireError` naming the field of a malformed one or an unknown loss.
        Cheap: the server calls it before queueing a request."""
        resolved = check_config(loss_fn, config)
        if not data:
            raise WireError("data", "no datums")
        checked = []
        for i, datum in enumerate(data):
            tokens = datum.tokens
            if int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size:
                raise WireError(f"data[{i}].model_input", f"token ids must lie in [0, {self.vocab_size})")
            checked.append(check_inputs(loss_fn, datum.loss_fn_inputs, tokens.size, i, self.vocab_size))
        return resolved, checked

    def forward_backward(
        self,
        loss_fn: str,
        data: Sequence[Datum],
        forward_only: bool,
        config: Mapping[str, float | str] | None = None,
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum outputs (`logprobs` of the target tokens) and metrics (`loss:sum`); grads accumulate.
        The loss of each datum is `losses.datum_loss` over the logprobs this model gives its targets.
        A request that fails midway (a datum whose loss is not finite) leaves the gradients as they were
        before it: the adapter's (small) gradients are copied first and put back."""
        resolved, checked = self.check(loss_fn, data, config)
        outputs: list[dict[str, np.ndarray]] = []
        terms: list[dict[str, float]] = []
        saved = [None if p.grad is None else p.grad.clone() for p in self.params] if not forward_only else []
        try:
            for i, (datum, inputs) in enumerate(zip(data, checked, strict=True)):
                with torch.set_grad_enabled(not forward_only):
                    logits = self.module(input_ids=torch.as_tensor(datum.tokens)[None]).logits[0].float()
                    targets = inputs.target_tokens
                    picked = torch.log_softmax(logits, dim=-1).gather(-1, targets.reshape(len(targets), -1))
                    result = datum_loss(loss_fn, picked.reshape(targets.shape), inputs, resolved, i)
                    if not forward_only:
                        torch.autograd.backward(result.loss)
                outputs.append(result.outputs)
                terms.append(result.metrics)
        except Exception:
            for param, grad in zip(self.params, saved, strict=False):
                param.grad = grad
            raise
        return outputs, merge_metrics(terms)

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


def _grad_norm(params: Sequence[torch.nn.Parameter]) -> float:
    grads = [p.grad.detach().double().norm() for p in params if p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0
