"""The training calls of a Tinker client, run on its adapter of a shared base (`adapters.AdapterHost`).

Tinker splits a step in two calls, which quartet's `TrainingEngine.train_step` does in one:
`forward_backward` here only accumulates gradients in the client's adapter, and the host's `optim_step`
applies torch's AdamW with the AdamParams of that call (each call may change the learning rate), then
clears the gradients.

Losses: every built-in Tinker loss the docs define (cross_entropy, importance_sampling, ppo, cispo, dro,
gspo), computed by `losses` over the logprobs the adapter gives each datum's target tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from quartet.serving.tinker.adapters import AdapterHost
from quartet.serving.tinker.losses import LossInputs, check_config, check_inputs, datum_loss, merge_metrics
from quartet.serving.tinker.wire import Datum, WireError

__all__ = ["NotServedError", "check", "forward_backward"]


class NotServedError(Exception):
    """A call or option the service does not serve; the message names it."""


def check(
    loss_fn: str,
    data: Sequence[Datum],
    vocab_size: int,
    config: Mapping[str, float | str] | None = None,
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
        if tokens.size == 0:
            raise WireError(f"data[{i}].model_input", "holds no tokens")
        if int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size:
            raise WireError(f"data[{i}].model_input", f"token ids must lie in [0, {vocab_size})")
        checked.append(check_inputs(loss_fn, datum.loss_fn_inputs, tokens.size, i, vocab_size))
    return resolved, checked


def forward_backward(
    host: AdapterHost,
    name: str,
    loss_fn: str,
    data: Sequence[Datum],
    forward_only: bool,
    config: Mapping[str, float | str] | None = None,
) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Per datum outputs (`logprobs` of the target tokens) and metrics (`loss:sum`) of adapter `name`;
    unless `forward_only`, the gradients accumulate in that adapter until its `optim_step`.

    A request that fails midway (a datum whose loss is not finite) leaves the gradients as they were
    before it: the adapter's (small) gradients are copied first and put back."""
    resolved, checked = check(loss_fn, data, host.vocab_size, config)
    outputs: list[dict[str, np.ndarray]] = []
    terms: list[dict[str, float]] = []
    saved = host.gradients(name) if not forward_only else []
    with host.active(name) as module:
        try:
            for i, (datum, inputs) in enumerate(zip(data, checked, strict=True)):
                with torch.set_grad_enabled(not forward_only):
                    logits = module(input_ids=torch.as_tensor(datum.tokens)[None]).logits[0].float()
                    targets = inputs.target_tokens
                    picked = torch.log_softmax(logits, dim=-1).gather(-1, targets.reshape(len(targets), -1))
                    result = datum_loss(loss_fn, picked.reshape(targets.shape), inputs, resolved, i)
                    if not forward_only:
                        torch.autograd.backward(result.loss)
                outputs.append(result.outputs)
                terms.append(result.metrics)
        except Exception:
            if not forward_only:
                host.set_gradients(name, saved)
            raise
    return outputs, merge_metrics(terms)
