"""The log-prob mismatch alarm: say, during the step, that the engine samples another policy than is trained.

PPO's ratio and the truncated importance weights assume that the log-probs the rollout engine reported
while sampling are the trainer's log-probs of the same tokens. After a correct weight sync the two differ by
numerics only; a bigger difference means the engine sampled from other weights (a weight sync skipped,
failed or applied late) or at another precision, and training quietly goes off-policy until the run
diverges. The step already measures it (`rollout/logprob_diff_*`, `agent/token_drift`); this module turns
the figures into an alarm (`trainer.mismatch_alarm`):

    watch = MismatchWatch.from_config(cfg)
    watch.check_logprobs(batch, step, "recompute")   # after the old-log-prob pass: per sample
    watch.check_drift(batch, step)                    # multi-turn: the chat template's re-render
    alarm = watch.take(step)                          # what tripped this step, as one alarm, or None

Phases: `recompute` (the trainer's old-log-prob pass against the engine's log-probs, per sample),
`update` (the on-policy update's own forward, when there is no separate pass: only the step's mean is
known), `drift` (the re-rendered conversation's tokens against the trajectory's). The threshold of the
log-prob check follows the trainer's compute dtype (see `TrainerConfig.mismatch_alarm_max_abs_diff` for
the figures it was chosen from): the trainer's numerics define the policy, so an engine in bfloat16 next
to a float32 trainer trips it, while two bfloat16 sides stay under the bfloat16 threshold. An fp8 engine
(`rollout.quantization=fp8`) gets the low-precision threshold whatever the trainer's dtype: its rounding is
the point, and TIS corrects for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from quartet.config import (
    AlarmMode,
    Backend,
    DeviceKind,
    Dtype,
    QuartetConfig,
    RolloutQuantization,
    plan_step,
)
from quartet.core.batch import Batch
from quartet.engines.precision import resolve_precision

__all__ = [
    "FP32_MAX_ABS_DIFF",
    "LOW_PRECISION_MAX_ABS_DIFF",
    "MismatchAlarm",
    "MismatchAlarmError",
    "MismatchWatch",
    "WorstSample",
    "trainer_compute_dtype",
]

FP32_MAX_ABS_DIFF = 3e-4
"""Derived threshold with a float32 trainer: above the built-in engine's 0 and vLLM's < 1e-3 worst token,
below a bfloat16 engine's 6e-4 mean on the tiny model."""
LOW_PRECISION_MAX_ABS_DIFF = 0.05
"""Derived threshold with a bfloat16/float16 trainer: bf16 rounding of a real model's logits gives a mean of
~1e-2 or below; a stale engine a step behind at a high learning rate goes past it."""
WORST = 3
"""Samples named in a message."""


class MismatchAlarmError(RuntimeError):
    """`trainer.mismatch_alarm=stop` and the alarm tripped; the message says where and why."""


@dataclass(frozen=True)
class WorstSample:
    """One sample among the furthest off: where it is in the batch and its figures."""

    row: int
    uid: str
    index: Any
    """The prompt's row in the dataset (`index` of the data), or None."""
    mean: float
    """Mean per-token |engine - trainer| log-prob (recompute), or the drift in tokens (drift)."""
    max: float
    """Largest per-token |engine - trainer| log-prob (recompute); the drift again for drift."""

    def describe(self) -> str:
        where = f"row {self.row} uid {self.uid}" + (f" index {self.index}" if self.index is not None else "")
        return f"{where}: mean {self.mean:.3g}, max {self.max:.3g}"


@dataclass(frozen=True)
class Finding:
    """One check that tripped: its phase, figure, threshold and the samples behind it."""

    phase: str
    figure: str
    value: float
    threshold: float
    key: str
    worst: tuple[WorstSample, ...] = ()
    causes: tuple[str, ...] = ()

    def describe(self) -> str:
        text = f"[{self.phase}] {self.figure} {self.value:.3g} > {self.threshold:.3g} (trainer.{self.key})"
        if self.worst:
            text += "; worst samples: " + "; ".join(w.describe() for w in self.worst)
        return text + "; likely causes: " + "; ".join(self.causes)


@dataclass(frozen=True)
class MismatchAlarm:
    """Everything that tripped in one step: one message, one record."""

    step: int
    findings: tuple[Finding, ...]

    @property
    def phases(self) -> str:
        return ",".join(f.phase for f in self.findings)

    def message(self) -> str:
        head = f"log-prob mismatch alarm at step {self.step} (phase {self.phases}): "
        return head + " | ".join(f.describe() for f in self.findings)

    def record(self) -> dict[str, Any]:
        """The `alarm` record of the run's trackers (metrics.jsonl keeps the strings; `quartet inspect`
        marks the step)."""
        first = self.findings[0]
        return {
            "step": self.step,
            "alarm": "mismatch",
            "phase": self.phases,
            "alarm/mismatch_value": first.value,  # namespaced: numeric trackers chart every number
            "alarm/mismatch_threshold": first.threshold,
            "message": self.message(),
            "worst": [{"row": w.row, "uid": w.uid, "mean": w.mean, "max": w.max} for w in first.worst],
        }


def trainer_compute_dtype(cfg: QuartetConfig) -> Dtype:
    """The actor's compute dtype as its workers resolve `actor.mixed_precision`, where the driver can tell
    (the local backend, or `cluster.device=cpu`: this machine's choice); else bfloat16, the tolerant one."""
    requested = cfg.actor.mixed_precision
    if requested is not Dtype.AUTO:
        return requested
    on_this_cpu = cfg.cluster.device is DeviceKind.CPU or (
        cfg.cluster.backend is Backend.LOCAL and not torch.cuda.is_available()
    )
    if not on_this_cpu:
        return Dtype.BFLOAT16
    try:
        return resolve_precision(requested, "cpu")
    except (ValueError, OSError):
        return Dtype.BFLOAT16


def _causes(cfg: QuartetConfig, trainer_dtype: Dtype, drift: float) -> tuple[str, ...]:
    """The likely causes of a log-prob mismatch, the most likely first; `drift`: the share of the step's
    trajectories whose re-render drifts."""
    engine = cfg.rollout.dtype
    dtypes = (
        f"rollout.dtype={engine}, trainer computes in {trainer_dtype} "
        f"(actor.mixed_precision={cfg.actor.mixed_precision})"
    )
    stale = (
        "stale or failed weight sync: the engine sampled with other weights than the trainer holds (a sync "
        "skipped, failed or applied late; see weight_sync/* and the rollout's weight version)"
    )
    if engine != trainer_dtype:
        causes = [f"dtype differs between engine and trainer: {dtypes}", stale]
    else:
        causes = [stale, f"numerics of the same dtype on both sides: {dtypes}"]
    if cfg.rollout.quantization is RolloutQuantization.FP8:
        causes.insert(
            0,
            "rollout.quantization=fp8: the engine samples with fp8-rounded weights (tiny model, float32 "
            "trainer: a mean of ~4e-3); actor.tis_cap corrects the update for it",
        )
    if drift > 0:
        causes.append(f"chat template re-rendering: {drift:.0%} of the trajectories drift this step")
    return tuple(causes)


def _drift_values(batch: Batch) -> np.ndarray | None:
    if "agent_metrics" not in batch.non_tensors:
        return None
    rows = [dict(m or {}) for m in batch.non_tensors["agent_metrics"]]
    if not any("agent/token_drift" in m for m in rows):
        return None
    return np.array([float(m.get("agent/token_drift", 0.0)) for m in rows], dtype=np.float64)


def _turns(batch: Batch) -> np.ndarray:
    rows = [dict(m or {}) for m in batch.non_tensors["agent_metrics"]]
    return np.array([float(m.get("agent/assistant_turns", 1.0)) for m in rows], dtype=np.float64)


def _sample(batch: Batch, row: int, mean: float, top: float) -> WorstSample:
    nt = batch.non_tensors
    uid = str(nt["uid"][row]) if "uid" in nt else ""
    raw = nt["index"][row] if "index" in nt else None
    index = raw.item() if isinstance(raw, np.generic) else raw
    return WorstSample(row, uid, index, mean, top)


@dataclass
class MismatchWatch:
    """The step's checks (module docstring); findings wait in `pending` until `take` gathers them."""

    cfg: QuartetConfig
    mode: AlarmMode
    max_abs_diff: float
    max_drift: float
    trainer_dtype: Dtype
    pending: list[Finding] = field(default_factory=list)
    generation_ahead: bool = False
    """The rollout generates ahead of training (`StepPlan.generation_ahead`): tokens may lag the trainer."""

    @classmethod
    def from_config(cls, cfg: QuartetConfig) -> MismatchWatch:
        t = cfg.trainer
        dtype = trainer_compute_dtype(cfg)
        # an fp8 engine rounds its weights to 3 mantissa bits: low precision whatever the trainer computes in
        fp8 = cfg.rollout.quantization is RolloutQuantization.FP8
        derived = FP32_MAX_ABS_DIFF if dtype is Dtype.FLOAT32 and not fp8 else LOW_PRECISION_MAX_ABS_DIFF
        limit = t.mismatch_alarm_max_abs_diff or derived
        ahead = plan_step(cfg).generation_ahead
        return cls(
            cfg, t.mismatch_alarm, limit, t.mismatch_alarm_max_drift_share, dtype, generation_ahead=ahead
        )

    def check_logprobs(self, batch: Batch, version: int, phase: str = "recompute") -> None:
        """Engine (`rollout_logprobs`) against trainer (`old_logprobs`) log-probs of the batch's tokens; the
        trainer holds weights `version`. With generation ahead of training (`StepPlan.generation_ahead`)
        only rows the engine sampled wholly with that version count: the others differ by design."""
        if self.mode is AlarmMode.OFF or "rollout_logprobs" not in batch or "old_logprobs" not in batch:
            return
        mask = batch["response_mask"].bool()
        versions = batch.get("rollout_versions", None)
        if versions is not None and self.generation_ahead:
            # rows sampled wholly with the trainer's weights: a row whose weights changed mid-generation
            # keeps the older prefix in its KV cache, so even its newest tokens differ by design
            current = ((versions == version) | ~mask).all(-1, keepdim=True)
            mask = mask & current
        weight = mask.double()
        diff = (batch["rollout_logprobs"].double() - batch["old_logprobs"].double()).abs() * weight
        tokens = weight.sum(-1)
        mean = float(diff.sum() / tokens.sum().clamp(min=1))
        if mean <= self.max_abs_diff:
            return
        per_row = diff.sum(-1) / tokens.clamp(min=1)
        top = diff.max(-1).values
        order = torch.argsort(per_row, descending=True)[:WORST].tolist()
        worst = tuple(_sample(batch, r, float(per_row[r]), float(top[r])) for r in order)
        drift = _drift_values(batch)
        causes = _causes(
            self.cfg, self.trainer_dtype, float((drift > 0).mean()) if drift is not None else 0.0
        )
        if versions is not None and bool(((versions != version) & mask).any()):
            seen = sorted({int(v) for v in versions[mask].unique().tolist()})
            lag = f"the engine reports weight versions {seen} for these tokens, the trainer is at {version}"
            causes = (lag, *causes)
        figure = "mean |logp_engine - logp_trainer| per token"
        self.pending.append(Finding(phase, figure, mean, self.max_abs_diff, self._diff_key, worst, causes))

    def check_update_mean(self, mean: float) -> None:
        """The on-policy update's mean difference (no separate pass: no per-sample figures)."""
        if self.mode is AlarmMode.OFF or mean <= self.max_abs_diff:
            return
        causes = _causes(self.cfg, self.trainer_dtype, 0.0)
        figure = "mean |logp_engine - logp_trainer| per token (update forward; no per-sample figures)"
        self.pending.append(Finding("update", figure, mean, self.max_abs_diff, self._diff_key, (), causes))

    def check_drift(self, batch: Batch) -> None:
        """Multi-turn: the share of trajectories whose `agent/token_drift` is above 0, against its threshold;
        the causes put the template first when the drifting trajectories have earlier model turns to
        re-render, the model's own tokenization when they are single-turn."""
        drift = _drift_values(batch)
        if self.mode is AlarmMode.OFF or drift is None:
            return
        drifting = drift > 0
        share = float(drifting.mean())
        if share <= self.max_drift:
            return
        order = np.argsort(-drift, kind="stable")[:WORST].tolist()
        worst = tuple(_sample(batch, r, float(drift[r]), float(drift[r])) for r in order)
        template = (
            "chat template re-rendering: the template renders the conversation to other tokens than the "
            "trajectory holds (it reformats or drops earlier turns, e.g. reasoning), so a trainer that "
            "re-tokenizes conversations trains on tokens the engine never sampled"
        )
        tokenization = (
            "non-canonical tokenization written by the model (an untrained or derailed model's tokens do not "
            "re-tokenize the same; nothing quartet trains on changes: it keeps the sampled ids)"
        )
        multi_turn = int((drifting & (_turns(batch) > 1)).sum())
        causes = (
            (template, tokenization) if 2 * multi_turn >= int(drifting.sum()) else (tokenization, template)
        )
        figure = "share of trajectories whose re-render drifts"
        key = "mismatch_alarm_max_drift_share"
        self.pending.append(Finding("drift", figure, share, self.max_drift, key, worst, causes))

    @property
    def _diff_key(self) -> str:
        fp8 = " and the fp8 rollout" if self.cfg.rollout.quantization is RolloutQuantization.FP8 else ""
        derived = (
            ""
            if self.cfg.trainer.mismatch_alarm_max_abs_diff
            else f", derived from {self.trainer_dtype}{fp8}"
        )
        return f"mismatch_alarm_max_abs_diff{derived}"

    def take(self, step: int) -> MismatchAlarm | None:
        """This step's findings as one alarm (None when nothing tripped); the watch starts empty again."""
        found, self.pending = tuple(self.pending), []
        return MismatchAlarm(step, found) if found else None
