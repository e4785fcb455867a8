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
    max_batch_tokens: int = 16384,
) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
    """Per datum outputs (`logprobs` of the target tokens) and metrics (`loss:sum`) of adapter `name`;
    unless `forward_only`, the gradients accumulate in that adapter until its `optim_step`.

    Datums run together, right-padded into batches of at most `max_batch_tokens` padded tokens (causal
    attention: padding after a datum's tokens changes none of its logits), one forward and one backward
    per batch. A request that fails midway (a datum whose loss is not finite) leaves the gradients as they
    were before it: the adapter's (small) gradients are copied first and put back."""
    resolved, checked = check(loss_fn, data, host.vocab_size, config)
    outputs: list[dict[str, np.ndarray]] = []
    terms: list[dict[str, float]] = []
    saved = host.gradients(name) if not forward_only else []
    with host.active(name) as module:
        try:
            for batch in _batches([d.tokens.size for d in data], max_batch_tokens):
                with torch.set_grad_enabled(not forward_only):
                    logits = _padded_logits(module, [data[i].tokens for i in batch], host.device)
                    losses = []
                    for row, i in enumerate(batch):
                        inputs = checked[i]
                        targets = inputs.target_tokens
                        logprobs = torch.log_softmax(logits[row, : len(targets)].float(), dim=-1)
                        index = targets.reshape(len(targets), -1).to(logprobs.device)
                        # only the picked logprobs leave the device; the losses run on them (CPU)
                        picked = logprobs.gather(-1, index).reshape(targets.shape).cpu()
                        result = datum_loss(loss_fn, picked, inputs, resolved, i)
                        losses.append(result.loss)
                        outputs.append(result.outputs)
                        terms.append(result.metrics)
                    if not forward_only:
                        torch.autograd.backward(torch.stack(losses).sum())
        except Exception:
            if not forward_only:
                host.set_gradients(name, saved)
            raise
    return outputs, merge_metrics(terms)


def _batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Consecutive datums grouped so that each group's padded size (rows x longest) stays within
    `max_tokens` (a datum longer than that runs alone)."""
    groups: list[list[int]] = []
    longest = 0
    for i, n in enumerate(lengths):
        if groups and max(longest, n) * (len(groups[-1]) + 1) <= max_tokens:
            groups[-1].append(i)
            longest = max(longest, n)
        else:
            groups.append([i])
            longest = n
    return groups


def _padded_logits(module: torch.nn.Module, rows: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    """The logits [rows, longest, vocab] of right-padded rows (padding masked out of attention)."""
    if len(rows) == 1:
        ids = torch.as_tensor(rows[0], device=device)[None]
        return module(input_ids=ids).logits  # type: ignore[no-any-return]
    longest = max(r.size for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.int64)
    mask = torch.zeros(len(rows), longest, dtype=torch.int64)
    for i, r in enumerate(rows):
        ids[i, : r.size] = torch.as_tensor(r)
        mask[i, : r.size] = 1
    return module(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # type: ignore[no-any-return]
