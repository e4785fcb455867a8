"""Trajectories -> the rollout Batch the trainer reads (the layout of `quartet.rollout.batch_io`).

Row i*n + j is trajectory j of prompt row i, every prompt column repeated so. The prompts are the
trajectories' own prompt ids (rendered with the tools, left-padded to the longest), so `prompts` is rebuilt
rather than copied from the input batch; the response holds model and environment tokens, right-padded to
`response_width`, with `response_mask` 1 only on model tokens and `attention_mask` 1 on every real token.
Environment rewards (a tool's or an interaction's) go to the non-tensor column `env_reward` (None where the
environment gave none) for a reward function to use. Rewards of single model turns go to `turn_rewards`
[B, R], on each turn's last token (quartet.core.turn_credit). `turn_spans` (non-tensor) lists each row's
turns as (role, start, stop) response positions: who wrote which tokens (rollout records show them).
With MoE routing recorded, `routed_experts` [B, P + R, L, k] lays each trajectory's record
(`quartet.agents.routing_track`) over its prompt and response columns as `quartet.rollout.batch_io` does
(0 on padding and on positions no engine call processed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from quartet.agents.trajectory import Trajectory
from quartet.core.batch import Batch
from quartet.core.routing import ROUTED_EXPERTS

__all__ = ["agent_batch_metrics", "trajectories_to_batch", "trajectory_metrics"]


def trajectories_to_batch(
    prompts: Batch, trajectories: Sequence[Trajectory], n: int, pad_token_id: int, response_width: int
) -> Batch:
    """The rollout batch of `trajectories` (row-major: n per prompt row of `prompts`)."""
    if len(trajectories) != len(prompts) * n:
        raise ValueError(f"{len(trajectories)} trajectories for {len(prompts)} prompts x n={n}")
    rows = len(trajectories)
    p = max(len(t.prompt_ids) for t in trajectories)
    r = response_width
    prompt_ids = torch.full((rows, p), pad_token_id, dtype=torch.int64)
    responses = torch.full((rows, r), pad_token_id, dtype=torch.int64)
    attention = torch.zeros(rows, p + r, dtype=torch.int64)
    response_mask = torch.zeros(rows, r, dtype=torch.int64)
    logprobs = torch.zeros(rows, r, dtype=torch.float32)
    turn_rewards = torch.zeros(rows, r, dtype=torch.float32)
    for i, t in enumerate(trajectories):
        if len(t.response_ids) > r:
            raise ValueError(f"trajectory {i} has {len(t.response_ids)} response tokens, the width is {r}")
        k, m = len(t.prompt_ids), len(t.response_ids)
        prompt_ids[i, p - k :] = torch.tensor(t.prompt_ids, dtype=torch.int64)
        attention[i, p - k : p + m] = 1
        if m:
            responses[i, :m] = torch.tensor(t.response_ids, dtype=torch.int64)
            response_mask[i, :m] = torch.tensor(t.response_mask, dtype=torch.int64)
            logprobs[i, :m] = torch.tensor(t.logprobs, dtype=torch.float32)
        model_turns = [span for span in t.turns if span.role == "assistant"]
        for span, reward in zip(model_turns, t.turn_rewards, strict=True):
            if span.stop > span.start:  # on the turn's last token, as outcome scores are placed
                turn_rewards[i, span.stop - 1] = reward
    base = prompts.drop("prompts", "attention_mask").repeat(n, interleave=True)
    columns = {
        "prompts": prompt_ids,
        "responses": responses,
        "response_mask": response_mask,
        "attention_mask": attention,
        "rollout_logprobs": logprobs,
        "turn_rewards": turn_rewards,
    }
    if all(t.versions is not None and len(t.versions) == len(t.response_ids) for t in trajectories):
        versions = torch.zeros(rows, r, dtype=torch.int64)
        for i, t in enumerate(trajectories):
            if t.versions:
                versions[i, : len(t.versions)] = torch.tensor(t.versions, dtype=torch.int64)
        columns["rollout_versions"] = versions
    routing = _routing(trajectories, p, r)
    if routing is not None:
        columns[ROUTED_EXPERTS] = routing
    non_tensors = {
        "finish_reason": np.array([str(t.finish_reason) for t in trajectories], dtype=object),
        "env_reward": np.array([t.reward for t in trajectories], dtype=object),
        "turn_spans": np.array(
            [[(span.role, span.start, span.stop) for span in t.turns] for t in trajectories] + [None],
            dtype=object,
        )[:-1],
    }
    return base.union(Batch(columns, non_tensors, batch_size=rows))


def _routing(trajectories: Sequence[Trajectory], p: int, r: int) -> torch.Tensor | None:
    """The trajectories' routing records over [P + R] columns (prompts left-padded to `p`), or None when
    none has one. A trajectory that lost its record (a model turn without one) while others have theirs is
    a ValueError: replaying zeros as experts would train on routing no engine chose."""
    first = next((t.routing.record for t in trajectories if t.routing and t.routing.record is not None), None)
    if first is None:
        return None
    lost = [i for i, t in enumerate(trajectories) if t.routing_lost]
    if lost:
        raise ValueError(
            f"trajectories {lost[:5]} have no MoE routing record while others do: one of their model turns "
            "came without one (an engine call that returned none; a custom agent loop must pass "
            "routing=out.routed_experts to Trajectory.add_model_turn)"
        )
    out = torch.zeros(len(trajectories), p + r, *first.shape[1:], dtype=first.dtype)
    for i, t in enumerate(trajectories):
        if t.routing is None or t.routing.record is None:
            continue  # no model turn at all (aborted before it wrote a token): nothing is trained
        start = p - len(t.prompt_ids)
        out[i, start : start + t.routing.covered] = t.routing.record
    return out


def trajectory_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Means over trajectories of their loop counters, plus turns and how trajectories ended."""
    if not trajectories:
        return {}
    out: dict[str, float] = {}
    keys = sorted({k for t in trajectories for k in t.metrics})
    for key in keys:
        out[f"{key}/mean"] = float(np.mean([t.metrics.get(key, 0.0) for t in trajectories]))
    for reason in sorted({str(t.finish_reason) for t in trajectories}):
        share = sum(t.finish_reason == reason for t in trajectories) / len(trajectories)
        out[f"agent/finish/{reason}"] = float(share)
    model_tokens = [sum(t.response_mask) / max(1, t.assistant_turns) for t in trajectories]
    out["agent/tokens_per_turn/mean"] = float(np.mean(model_tokens))
    return out


def agent_batch_metrics(batch: Batch, success_score: float = 1.0) -> dict[str, float]:
    """The multi-turn figures of a rollout batch (from `quartet.agents.runner`'s columns); {} without them.

    Per loop counter k (tool calls, failures by kind and by tool, turns, drift): `k/mean` per trajectory,
    and for `tool/*` counters `k/total` over the batch; latency and drift also `.../max`. How trajectories
    ended: `agent/finish/<reason>` shares (aborted, truncated at max_tokens, cut at the deadline, ...),
    and `agent/deadline_cut/total`; with template_mode=rerender,
    `agent/template_rerender_breaks/{mean,total}` (turns whose rendering changed tokens already held).
    Model tokens per turn: `agent/tokens_per_turn/mean`. Once scored
    (`token_level_scores`): `agent/success/mean`, the share whose outcome score reaches `success_score`,
    and `agent/turns_to_success/mean`, the model turns of those. `agent/tool_error_rate`: failed tool calls
    over all calls. `agent/turn_reward/mean`: per trajectory, the sum of its turns' rewards.
    """
    if "agent_metrics" not in batch.non_tensors:
        return {}
    rows: list[dict[str, float]] = [dict(m or {}) for m in batch.non_tensors["agent_metrics"]]
    if not rows:
        return {}
    out: dict[str, float] = {}
    for key in sorted({k for m in rows for k in m}):
        values = np.array([m.get(key, 0.0) for m in rows], dtype=np.float64)
        if "latency" in key:
            name = key.removesuffix("/max")
            out[f"{name}/max"] = float(values.max())
            out[f"{name}/mean"] = float(values.mean())
            continue
        out[f"{key}/mean"] = float(values.mean())
        if key.startswith("tool/"):
            out[f"{key}/total"] = float(values.sum())
        if key == "agent/token_drift":
            out[f"{key}/max"] = float(values.max())
        if key in ("agent/deadline_cut", "agent/template_rerender_breaks"):
            out[f"{key}/total"] = float(values.sum())
    if "finish_reason" in batch.non_tensors:
        reasons = [str(r) for r in batch.non_tensors["finish_reason"]]
        for reason in sorted(set(reasons)):
            out[f"agent/finish/{reason}"] = reasons.count(reason) / len(reasons)
    turns = np.array([max(1.0, m.get("agent/assistant_turns", 1.0)) for m in rows])
    model_tokens = batch["response_mask"].sum(-1).double().numpy()
    out["agent/tokens_per_turn/mean"] = float((model_tokens / turns).mean())
    calls = sum(m.get("tool/calls", 0.0) for m in rows)
    if calls:
        out["agent/tool_error_rate"] = sum(m.get("tool/failed", 0.0) for m in rows) / calls
    if "turn_rewards" in batch:
        out["agent/turn_reward/mean"] = float(batch["turn_rewards"].sum(-1).double().mean())
    if "token_level_scores" in batch:
        success = (batch["token_level_scores"].sum(-1) >= success_score).numpy()
        out["agent/success/mean"] = float(success.mean())
        if success.any():
            out["agent/turns_to_success/mean"] = float(turns[success].mean())
    return out
