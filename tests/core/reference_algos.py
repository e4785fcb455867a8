"""Slow, obvious reference implementations of the RL math, for tests only.

Written independently of `quartet.core`: plain Python floats (float64) and loops over samples and tokens,
closed-form sums where the library uses a recursion. Inputs are nested lists (`rows(t)`, `bools(m)`).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Hashable, Sequence

import torch

Rows = list[list[float]]
Mask = list[list[bool]]

WHITEN_EPS = 1e-8


def rows(t: torch.Tensor) -> Rows:
    return t.detach().double().tolist()


def bools(m: torch.Tensor) -> Mask:
    return (m != 0).tolist()


def tensor(x: Rows | list[float]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def zeros_like(mask: Mask) -> Rows:
    return [[0.0] * len(row) for row in mask]


def valid_positions(mask_row: list[bool]) -> list[int]:
    return [t for t, ok in enumerate(mask_row) if ok]


def whiten(x: Rows, mask: Mask) -> Rows:
    vals = [x[i][t] for i in range(len(x)) for t in valid_positions(mask[i])]
    out = zeros_like(mask)
    if not vals:
        return out
    mean = sum(vals) / len(vals)
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1) if len(vals) > 1 else 0.0
    for i in range(len(x)):
        for t in valid_positions(mask[i]):
            out[i][t] = (x[i][t] - mean) / math.sqrt(var + WHITEN_EPS)
    return out


def gae(rewards: Rows, values: Rows, mask: Mask, gamma: float, lam: float) -> tuple[Rows, Rows]:
    """Closed form over valid positions p_0 < ... < p_{n-1}: A_k = sum_{l>=k} (gamma lam)^(l-k) delta_l."""
    adv, ret = zeros_like(mask), zeros_like(mask)
    for i in range(len(mask)):
        pos = valid_positions(mask[i])
        deltas = []
        for k, t in enumerate(pos):
            next_v = values[i][pos[k + 1]] if k + 1 < len(pos) else 0.0
            deltas.append(rewards[i][t] + gamma * next_v - values[i][t])
        for k, t in enumerate(pos):
            adv[i][t] = sum((gamma * lam) ** (j - k) * deltas[j] for j in range(k, len(pos)))
            ret[i][t] = adv[i][t] + values[i][t]
    return adv, ret


def outcome_scores(rewards: Rows, mask: Mask) -> list[float]:
    return [sum(rewards[i][t] for t in valid_positions(mask[i])) for i in range(len(mask))]


def groups_of(index: Sequence[Hashable]) -> dict[Hashable, list[int]]:
    out: dict[Hashable, list[int]] = defaultdict(list)
    for i, key in enumerate(index):
        out[key].append(i)
    return out


def spread(per_row: list[float], mask: Mask) -> Rows:
    out = zeros_like(mask)
    for i in range(len(mask)):
        for t in valid_positions(mask[i]):
            out[i][t] = per_row[i]
    return out


def grpo(rewards: Rows, mask: Mask, index: Sequence[Hashable], eps: float, by_std: bool) -> Rows:
    scores = outcome_scores(rewards, mask)
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        if len(members) == 1:
            continue  # lone sample: no baseline, advantage 0
        vals = [scores[i] for i in members]
        mean, std = statistics.fmean(vals), statistics.stdev(vals)
        for i in members:
            adv[i] = (scores[i] - mean) / (std + eps) if by_std else scores[i] - mean
    return spread(adv, mask)


def rloo(rewards: Rows, mask: Mask, index: Sequence[Hashable]) -> Rows:
    scores = outcome_scores(rewards, mask)
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        for i in members:
            others = [scores[j] for j in members if j != i]
            adv[i] = scores[i] - sum(others) / len(others) if others else 0.0
    return spread(adv, mask)


def opo(rewards: Rows, mask: Mask, index: Sequence[Hashable]) -> Rows:
    scores = outcome_scores(rewards, mask)
    lengths = [len(valid_positions(row)) for row in mask]
    adv = [0.0] * len(scores)
    for members in groups_of(index).values():
        if len(members) == 1:
            continue
        total = sum(lengths[j] for j in members)
        baseline = sum(lengths[j] * scores[j] for j in members) / total if total else 0.0
        for i in members:
            adv[i] = scores[i] - baseline
    return spread(adv, mask)


def discounted_returns(rewards: Rows, mask: Mask, gamma: float) -> Rows:
    out = zeros_like(mask)
    for i in range(len(mask)):
        pos = valid_positions(mask[i])
        for k, t in enumerate(pos):
            out[i][t] = sum(gamma ** (j - k) * rewards[i][pos[j]] for j in range(k, len(pos)))
    return out


def reinforce_pp(rewards: Rows, mask: Mask, gamma: float) -> tuple[Rows, Rows]:
    ret = discounted_returns(rewards, mask, gamma)
    return whiten(ret, mask), ret


def reinforce_pp_baseline(rewards: Rows, mask: Mask, index: Sequence[Hashable]) -> Rows:
    scores = outcome_scores(rewards, mask)
    centred = [0.0] * len(scores)
    counted = [[False] * len(row) for row in mask]
    for members in groups_of(index).values():
        if len(members) == 1:
            continue
        mean = statistics.fmean(scores[j] for j in members)
        for i in members:
            centred[i] = scores[i] - mean
            counted[i] = list(mask[i])
    return whiten(spread(centred, counted), counted)


def remax(rewards: Rows, mask: Mask, baselines: list[float]) -> tuple[Rows, Rows]:
    adv, ret = zeros_like(mask), zeros_like(mask)
    for i in range(len(mask)):
        pos = valid_positions(mask[i])
        for t in pos:
            to_go = sum(rewards[i][u] for u in pos if u >= t)
            ret[i][t] = to_go
            adv[i][t] = to_go - baselines[i]
    return adv, ret


def singleton_groups(index: Sequence[Hashable]) -> int:
    return sum(1 for members in groups_of(index).values() if len(members) == 1)


# ---- losses ---------------------------------------------------------------------------------------------


def aggregate(
    loss: Rows,
    mask: Mask,
    mode: str,
    n_tok: float | None = None,
    n_seq: float | None = None,
    norm: float | None = None,
) -> float:
    """The five modes, as loops; n_tok / n_seq / norm override the local denominators."""
    seq_sums, seq_means, tokens, seqs = [], [], 0, 0
    for i in range(len(mask)):
        pos = valid_positions(mask[i])
        if not pos:
            continue
        seqs += 1
        tokens += len(pos)
        s = sum(loss[i][t] for t in pos)
        seq_sums.append(s)
        seq_means.append(s / len(pos))
    n_tok = max(n_tok if n_tok is not None else tokens, 1)
    n_seq = max(n_seq if n_seq is not None else seqs, 1)
    if mode == "token-mean":
        return sum(seq_sums) / n_tok
    if mode == "seq-mean-token-sum":
        return sum(seq_sums) / n_seq
    if mode == "seq-mean-token-mean":
        return sum(seq_means) / n_seq
    if mode == "seq-mean-token-sum-norm":
        c = norm if norm is not None else len(mask[0])
        return sum(seq_sums) / (c * n_seq)
    if mode == "token-sum":  # verl: the masked sum, no denominator
        return sum(seq_sums)
    raise ValueError(mode)


def masked_token_mean(x: Rows, mask: Mask) -> float:
    vals = [x[i][t] for i in range(len(x)) for t in valid_positions(mask[i])]
    return sum(vals) / len(vals) if vals else 0.0


def ppo_token(logp: float, old: float, adv: float, low: float, high: float, c: float) -> dict[str, float]:
    """One token of the PPO loss, written out case by case."""
    log_ratio = min(max(logp - old, -20.0), 20.0)
    ratio = math.exp(log_ratio)
    clipped_ratio = min(max(ratio, 1.0 - low), 1.0 + high)
    l1, l2 = -adv * ratio, -adv * clipped_ratio
    loss = max(l1, l2)
    dual = 0.0
    if c > 0 and adv < 0 and loss > -adv * c:
        loss, dual = -adv * c, 1.0
    return {
        "loss": loss,
        "high": 1.0 if (adv > 0 and ratio > 1.0 + high) else 0.0,
        "low": 1.0 if (adv < 0 and ratio < 1.0 - low) else 0.0,
        "dual": dual,
        "kl": -log_ratio,
        "kl3": ratio - 1.0 - log_ratio,
    }


def ppo_tokens(
    logp: Rows, old: Rows, adv: Rows, mask: Mask, low: float, high: float, c: float
) -> tuple[Rows, dict[str, float]]:
    """Per-token losses (Rows) and masked-mean metrics (dict)."""
    losses = zeros_like(mask)
    keys = ("high", "low", "dual", "kl", "kl3")
    per_key: dict[str, Rows] = {k: zeros_like(mask) for k in keys}
    for i in range(len(mask)):
        for t in range(len(mask[i])):
            out = ppo_token(logp[i][t], old[i][t], adv[i][t], low, high, c)
            losses[i][t] = out["loss"]
            for k in keys:
                per_key[k][i][t] = out[k]
    return losses, {k: masked_token_mean(v, mask) for k, v in per_key.items()}


def gspo_tokens(logp: Rows, old: Rows, adv: Rows, mask: Mask, low: float, high: float) -> Rows:
    losses = zeros_like(mask)
    for i in range(len(mask)):
        pos = valid_positions(mask[i])
        mean_log = sum(logp[i][t] - old[i][t] for t in pos) / len(pos) if pos else 0.0
        s = math.exp(min(mean_log, 10.0))
        for t in range(len(mask[i])):
            a = adv[i][t]
            losses[i][t] = max(-a * s, -a * min(max(s, 1.0 - low), 1.0 + high))
    return losses


def tis_weights(old: Rows, rollout: Rows, mask: Mask, cap: float) -> Rows:
    out = zeros_like(mask)
    for i in range(len(mask)):
        for t in range(len(mask[i])):
            out[i][t] = min(math.exp(old[i][t] - rollout[i][t]), cap) if mask[i][t] else 1.0
    return out


def value_tokens(v: Rows, old: Rows, ret: Rows, clip: float) -> tuple[Rows, Rows]:
    losses = [[0.0] * len(r) for r in v]
    flags = [[0.0] * len(r) for r in v]
    for i in range(len(v)):
        for t in range(len(v[i])):
            v_clip = min(max(v[i][t], old[i][t] - clip), old[i][t] + clip)
            a, b = (v[i][t] - ret[i][t]) ** 2, (v_clip - ret[i][t]) ** 2
            losses[i][t] = 0.5 * max(a, b)
            flags[i][t] = 1.0 if b > a else 0.0
    return losses, flags


def kl_forward(logp: float, ref: float, name: str) -> float:
    """verl's `kl_penalty` forward value for a name without "+" (from verl's docs and Schulman 2020).

    k1 / kl: log pi - log pi_ref; abs: its magnitude; k2 / mse: half its square; k3 / low_var_kl:
    with y = log pi_ref - log pi clipped to [-20, 20], e^y - y - 1 clipped to [-10, 10].
    """
    x = logp - ref
    if name in ("k1", "kl"):
        return x
    if name == "abs":
        return abs(x)
    if name in ("k2", "mse"):
        return 0.5 * x * x
    if name in ("k3", "low_var_kl"):
        y = min(max(-x, -20.0), 20.0)
        return min(max(math.exp(y) - y - 1.0, -10.0), 10.0)
    raise ValueError(name)


def kl_value(logp: float, ref: float, kind: str) -> float:
    """The forward value: a "+" name has the value of the name without it."""
    return kl_forward(logp, ref, kind.removesuffix("+"))


def kl_grad(logp: float, ref: float, kind: str) -> float:
    """d k / d logp, by hand: a "+" name has the gradient of k2 (x); the others their own derivative."""
    x = logp - ref
    if kind.endswith("+") or kind in ("k2", "mse"):
        return x
    if kind in ("k1", "kl"):
        return 1.0
    if kind == "abs":
        return 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)
    # k3: d/dlogp of e^y - y - 1 with y = -x is 1 - e^y inside both clamps, 0 where either clamp bites
    y = -x
    if abs(y) > 20.0:
        return 0.0
    value = math.exp(y) - y - 1.0
    return 0.0 if value > 10.0 else 1.0 - math.exp(y)


def entropy(logits: list[float]) -> float:
    finite = [z for z in logits if z != float("-inf")]
    m = max(finite)
    total = sum(math.exp(z - m) for z in finite)
    probs = [math.exp(z - m) / total for z in finite]
    return -sum(p * math.log(p) for p in probs if p > 0)


def variance(vals: list[float]) -> float:
    return statistics.variance(vals) if len(vals) > 1 else 0.0
