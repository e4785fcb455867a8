"""The training calls of a Tinker client, run on its adapter of a shared base (`adapters.AdapterHost`).

Tinker splits a step in two calls, which quartet's `TrainingEngine.train_step` does in one:
`forward_backward` here only accumulates gradients in the client's adapter, and the host's `optim_step`
applies torch's AdamW with the AdamParams of that call (each call may change the learning rate), then
clears the gradients.

Losses: `cross_entropy` (the Tinker docs' definition: the sum over target tokens of
-weights * logprob(target), with the per-token `logprobs` returned). Other losses raise `NotServedError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from quartet.serving.tinker.adapters import AdapterHost
from quartet.serving.tinker.wire import Datum, WireError

__all__ = ["NotServedError", "check", "forward_backward"]


class NotServedError(Exception):
    """A call or option the service does not serve yet; the message names it."""


def check(loss_fn: str, data: Sequence[Datum], vocab_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
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
            if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                raise WireError(f"data[{i}].{name}", f"token ids must lie in [0, {vocab_size})")
        checked.append((targets, weights))
    return checked


def forward_backward(
    host: AdapterHost, name: str, loss_fn: str, data: Sequence[Datum], forward_only: bool
) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Per datum outputs (`logprobs` of the target tokens) and metrics (`loss:sum`) of adapter `name`;
    unless `forward_only`, the gradients accumulate in that adapter until its `optim_step`."""
    outputs: list[dict[str, np.ndarray]] = []
    total = torch.zeros((), dtype=torch.float64)
    with host.active(name) as module:
        for datum, (targets, weights) in zip(data, check(loss_fn, data, host.vocab_size), strict=True):
            with torch.set_grad_enabled(not forward_only):
                logits = module(input_ids=torch.as_tensor(datum.tokens)[None]).logits[0].float()
                logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
                loss = -(logprobs * weights).sum()
                if not forward_only:
                    torch.autograd.backward(loss)
            total += loss.detach().double()
            outputs.append({"logprobs": logprobs.detach().numpy()})
    return outputs, {"loss:sum": float(total)}


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
