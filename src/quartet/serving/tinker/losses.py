"""The Tinker built-in losses: what `forward_backward(data, loss_fn, loss_fn_config)` computes per datum.

Pure functions over tensors, no model inside. The backend computes each datum's `target_logprobs` (the
model's log-probability of `target_tokens` at every position) and calls, in order:

- `check_config(loss_fn, config)` and `check_inputs(loss_fn, datum_inputs, n_tokens, index, vocab_size)`:
  cheap, before anything is queued; a malformed request raises `WireError` naming the field
  (`loss_fn`, `loss_fn_config.beta`, `data[3].loss_fn_inputs.advantages`), which the server answers 400.
- `datum_loss(loss_fn, target_logprobs, inputs, config, index)`: the scalar loss to backpropagate, the
  datum's outputs (`logprobs`) and its metric contributions; `merge_metrics` combines those over the
  batch. A loss that is not finite raises `WireError` naming `data[index]` (a user error) before the
  caller backpropagates it.

Every loss is a SUM over the datum's positions and over the batch (no mean): the client scales through
weights or advantages, as the Tinker docs say ("for all objectives we sum the token-level losses").

Notation: lp = `target_logprobs` (returned per datum as the output `logprobs`), q = the sampler's
logprobs (the input `logprobs`), A = `advantages`, r = exp(lp - q), sg = stop-gradient, clip = clamp to
[`clip_low_threshold`, `clip_high_threshold`]. Inputs are float32 of shape (N,), N = the number of input
tokens, `target_tokens` int64 (N,), unless said otherwise. Each loss outputs `logprobs` (lp, the shape of
`target_tokens`) and the metric `loss:sum` (the batch's summed loss).

Each loss: its `loss_fn_inputs`, its `loss_fn_config` keys (default), its loss per datum.

- cross_entropy: target_tokens (N,) or (N, K), weights (same shape, default 1); no config;
  -sum(weights * lp).
- importance_sampling: target_tokens, logprobs, advantages; no config; -sum(r * A).
- ppo: target_tokens, logprobs, advantages; clip_low_threshold (0.8), clip_high_threshold (1.2);
  -sum(min(r * A, clip(r) * A)).
- cispo: target_tokens, logprobs, advantages; clip_low_threshold (0.0), clip_high_threshold (4.0);
  -sum(sg(clip(r)) * lp * A).
- dro: target_tokens, logprobs, advantages; beta (required); -sum(lp * A - beta / 2 * (lp - q)^2).
- gspo: target_tokens, logprobs, advantages, sequence_ratio_mask; clip_low_threshold (0.8),
  clip_high_threshold (1.2); -sum(min(s_t * A, clip(s_t) * A)), s_t below.

Sources (Tinker docs, read 2026-11): cross_entropy, importance_sampling, ppo, cispo, dro:
https://tinker-docs.thinkingmachines.ai/losses (the cookbook's docs/losses.mdx) and the pages under
https://tinker-docs.thinkingmachines.ai/tinker/losses/ (`importance-sampling`, `ppo`, `cispo`, `dro`,
`gspo`). Choices where the docs are silent, each said here:

- cross_entropy with 2-D `target_tokens` (N, K): several targets per position, `weights` (N, K), output
  `logprobs` (N, K). The docs show (N,) only; the SDK's `forward_backward_custom` docstring and the
  cookbook's top-k distillation (`distillation/train_off_policy.py`) send (N, K) to `cross_entropy`.
- ppo: the docs fix epsilon to 0.2, so the thresholds default to 0.8 and 1.2; the keys are those of
  the docs' `loss_fn_config` example. cispo: the docs' defaults (0.0, 4.0).
- dro: the docs give `beta` by example (0.05) and no default, so `beta` is required (400 without it).
- gspo: the stored page stops before its defaults, so PPO's (0.8, 1.2); GSPO-token as the docs write it:
  s = exp(mean over the tokens `sequence_ratio_mask` marks of sg(lp) - q), s_t = s * exp(lp - sg(lp)) (the
  value of s, the gradient of lp). `sequence_ratio_mask` is required (the cookbook always sends it: a
  default of every position would mix the prompt's padded q = 0 into the ratio) and must mark a token.
- Thresholds: 0 <= clip_low_threshold <= 1 <= clip_high_threshold, finite (the ratio 1 of on-policy data
  is never clipped); `beta` >= 0. Unknown config keys, text values and unknown input names are refused.
- `stable_reinforce` is not served: no public definition, and it needs per-sequence information the
  sampler records (`record_stability_info`), which this service does not sample yet. `custom` (a loss
  uploaded by `create_custom_loss`) is never served: model-written code does not run in the service;
  the SDK runs custom losses client-side through `forward_backward_custom` (a `forward`, then a
  `cross_entropy` whose weights are -dLoss/dlogprobs), which needs only `cross_entropy` here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from quartet.serving.tinker.wire import WireError

__all__ = [
    "SERVED",
    "DatumLoss",
    "LossInputs",
    "check_config",
    "check_inputs",
    "datum_loss",
    "merge_metrics",
]

_CLIPS = ("clip_low_threshold", "clip_high_threshold")
_RL = ("target_tokens", "logprobs", "advantages")


@dataclasses.dataclass(frozen=True)
class _Loss:
    required: tuple[str, ...]
    optional: tuple[str, ...]
    config: Mapping[str, float | None]  # key -> default (None: required)


SERVED: Mapping[str, _Loss] = {
    "cross_entropy": _Loss(("target_tokens",), ("weights",), {}),
    "importance_sampling": _Loss(_RL, (), {}),
    "ppo": _Loss(_RL, (), dict(zip(_CLIPS, (0.8, 1.2), strict=True))),
    "cispo": _Loss(_RL, (), dict(zip(_CLIPS, (0.0, 4.0), strict=True))),
    "dro": _Loss(_RL, (), {"beta": None}),
    "gspo": _Loss((*_RL, "sequence_ratio_mask"), (), dict(zip(_CLIPS, (0.8, 1.2), strict=True))),
}
"""The served losses: their inputs and their config keys with defaults (see the module docstring)."""

_REFUSED = {
    "stable_reinforce": "it has no public definition and needs the per-sequence information the sampler "
    "records (record_stability_info), which this service does not sample yet; use importance_sampling, "
    "ppo, cispo or gspo",
    "custom": "server-side custom losses (create_custom_loss) never run here: model-written code does "
    "not run in the service; forward_backward_custom with a callable or a client-side LossHandle runs "
    "the loss in the client",
}


@dataclasses.dataclass(frozen=True)
class LossInputs:
    """One datum's checked `loss_fn_inputs` as tensors; absent ones are None."""

    target_tokens: torch.Tensor
    """int64, (N,) or (N, K) for cross_entropy."""
    weights: torch.Tensor | None = None
    sampling_logprobs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    sequence_ratio_mask: torch.Tensor | None = None


@dataclasses.dataclass(frozen=True)
class DatumLoss:
    """What one datum contributes: the loss to backpropagate, its outputs and its metric terms."""

    loss: torch.Tensor
    outputs: dict[str, np.ndarray]
    metrics: dict[str, float]


def _known(loss_fn: str) -> _Loss:
    spec = SERVED.get(loss_fn)
    if spec is not None:
        return spec
    if loss_fn in _REFUSED:
        raise WireError("loss_fn", f"{loss_fn!r} is not served: {_REFUSED[loss_fn]}")
    raise WireError("loss_fn", f"{loss_fn!r} is not a served loss (served: {', '.join(SERVED)})")


def check_config(loss_fn: str, config: Mapping[str, float | str] | None) -> dict[str, float]:
    """`loss_fn`'s config with its defaults filled in; raises `WireError` naming the loss or the key."""
    spec = _known(loss_fn)
    given = dict(config or {})
    resolved: dict[str, float] = {}
    for key, value in given.items():
        field = f"loss_fn_config.{key}"
        if key not in spec.config:
            takes = ", ".join(spec.config) or "no keys"
            raise WireError(field, f"{loss_fn} does not take {key!r} (it takes {takes})")
        if isinstance(value, str) or not math.isfinite(float(value)):
            raise WireError(field, f"must be a finite number, not {value!r}")
        resolved[key] = float(value)
    for key, default in spec.config.items():
        if key not in resolved:
            if default is None:
                raise WireError(f"loss_fn_config.{key}", f"missing ({loss_fn} needs {key}, e.g. 0.05)")
            resolved[key] = default
    if "beta" in resolved and resolved["beta"] < 0:
        raise WireError("loss_fn_config.beta", f"must be >= 0, not {resolved['beta']}")
    if "clip_low_threshold" in resolved:
        low, high = resolved["clip_low_threshold"], resolved["clip_high_threshold"]
        if not 0.0 <= low <= 1.0:
            raise WireError("loss_fn_config.clip_low_threshold", f"must lie in [0, 1], not {low}")
        if high < 1.0:
            raise WireError("loss_fn_config.clip_high_threshold", f"must be >= 1, not {high}")
    return resolved


def check_inputs(
    loss_fn: str, datum_inputs: Mapping[str, np.ndarray], n_tokens: int, index: int, vocab_size: int
) -> LossInputs:
    """One datum's inputs for `loss_fn`, checked: names, shapes (N = `n_tokens` positions), finite
    values, target ids in [0, `vocab_size`). Raises `WireError` naming `data[index].loss_fn_inputs.<name>`."""
    spec = _known(loss_fn)
    prefix = f"data[{index}].loss_fn_inputs"
    for name in datum_inputs:
        if name not in spec.required + spec.optional:
            takes = ", ".join(spec.required + spec.optional)
            raise WireError(f"{prefix}.{name}", f"{loss_fn} does not take {name!r} (it takes {takes})")
    for name in spec.required:
        if name not in datum_inputs:
            raise WireError(f"{prefix}.{name}", f"missing ({loss_fn} needs {', '.join(spec.required)})")
    targets = np.asarray(datum_inputs["target_tokens"])
    if targets.dtype.kind not in "iu":
        raise WireError(f"{prefix}.target_tokens", f"must be int64 token ids, not {targets.dtype}")
    two_d = loss_fn == "cross_entropy" and targets.ndim == 2
    shape = targets.shape if two_d else (n_tokens,)
    if targets.shape[:1] != (n_tokens,) or (targets.ndim != 1 and not two_d):
        want = "(N,) or (N, K)" if loss_fn == "cross_entropy" else "(N,)"
        problem = f"shape {list(targets.shape)} is not {want} for N = {n_tokens} input tokens"
        raise WireError(f"{prefix}.target_tokens", problem)
    if targets.size and (int(targets.min()) < 0 or int(targets.max()) >= vocab_size):
        raise WireError(f"{prefix}.target_tokens", f"token ids must lie in [0, {vocab_size})")
    floats = {name: _floats(datum_inputs[name], shape, f"{prefix}.{name}") for name in datum_inputs}
    floats.pop("target_tokens")
    mask = floats.get("sequence_ratio_mask")
    if mask is not None and not bool((mask != 0).any()):
        raise WireError(f"{prefix}.sequence_ratio_mask", "marks no token (the sequence ratio needs one)")
    return LossInputs(
        target_tokens=torch.as_tensor(targets.astype(np.int64)),
        weights=floats.get("weights"),
        sampling_logprobs=floats.get("logprobs"),
        advantages=floats.get("advantages"),
        sequence_ratio_mask=mask,
    )


def _floats(raw: np.ndarray, shape: tuple[int, ...], field: str) -> torch.Tensor:
    values = np.asarray(raw)
    if values.shape != shape:
        raise WireError(field, f"shape {list(values.shape)} is not the targets' {list(shape)}")
    result = torch.as_tensor(values.astype(np.float32).reshape(shape))
    if not bool(torch.isfinite(result).all()):
        raise WireError(field, "holds a NaN or an infinite value")
    return result


def datum_loss(
    loss_fn: str,
    target_logprobs: torch.Tensor,
    inputs: LossInputs,
    config: Mapping[str, float],
    index: int = 0,
) -> DatumLoss:
    """The loss of datum `index` (a scalar, differentiable through `target_logprobs`), its outputs and its
    `loss:sum` term. `config` is `check_config`'s result, `inputs` is `check_inputs`'s. A loss that is not
    finite (e.g. sampling logprobs so low that exp(lp - q) overflows) raises `WireError` naming the datum,
    before the caller backpropagates it into the adapter's gradients."""
    lp = target_logprobs
    if loss_fn == "cross_entropy":
        weights = inputs.weights if inputs.weights is not None else torch.ones_like(lp)
        loss = -(lp * weights).sum()
    else:
        loss = _policy_loss(loss_fn, lp, inputs, config)
    if not bool(torch.isfinite(loss.detach())):
        raise WireError(f"data[{index}]", f"the {loss_fn} loss is {float(loss.detach())}: check its inputs")
    outputs = {"logprobs": lp.detach().float().numpy()}
    return DatumLoss(loss, outputs, {"loss:sum": float(loss.detach())})


def _policy_loss(
    loss_fn: str, lp: torch.Tensor, inputs: LossInputs, config: Mapping[str, float]
) -> torch.Tensor:
    q, adv = inputs.sampling_logprobs, inputs.advantages
    assert q is not None and adv is not None, "check_inputs makes logprobs and advantages present"
    if loss_fn == "dro":
        return -(lp * adv - 0.5 * config["beta"] * (lp - q) ** 2).sum()
    if loss_fn == "gspo":
        mask = inputs.sequence_ratio_mask
        assert mask is not None, "check_inputs makes sequence_ratio_mask present for gspo"
        log_ratio = (lp.detach() - q)[mask != 0].mean()
        ratio = torch.exp(log_ratio + lp - lp.detach())
    else:
        ratio = torch.exp(lp - q)
    if loss_fn == "importance_sampling":
        return -(ratio * adv).sum()
    clipped = torch.clamp(ratio, config["clip_low_threshold"], config["clip_high_threshold"])
    if loss_fn == "cispo":
        return -(clipped.detach() * lp * adv).sum()
    return -torch.minimum(ratio * adv, clipped * adv).sum()  # ppo, gspo


def merge_metrics(per_datum: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The batch's metrics from the datums' terms, by each name's reduction suffix: `:sum` adds, `:mean`
    averages, `:max` / `:min` take the extreme (the Tinker convention `name:reduction`)."""
    merged: dict[str, float] = {}
    for name in dict.fromkeys(key for terms in per_datum for key in terms):
        values = [float(terms[name]) for terms in per_datum if name in terms]
        reduction = name.rsplit(":", 1)[-1]
        if reduction == "mean":
            merged[name] = sum(values) / len(values)
        elif reduction == "max":
            merged[name] = max(values)
        elif reduction == "min":
            merged[name] = min(values)
        else:
            merged[name] = math.fsum(values)
    return merged
