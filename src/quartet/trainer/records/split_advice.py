"""The split advisor: from each pool's measured busy time per step, the rollout:trainer share of the devices
and the `trainer.async_buffer` that leave the least idle time, with the step and idle times expected.

Inputs are what a few steps measure (`timing_s/step` minus `timing_s/trainer_idle` and minus
`timing_s/rollout_idle`, `quartet.trainer.records.busy_time`) and the shares each pool had. The model, and its
assumptions (docs/async.md, "The split advisor"):

- **Work is conserved and scales perfectly**: a pool's busy time per step is its work (share x seconds)
  divided by its share, so doubling the rollout's CPUs halves generation. Real scaling is sublinear (a
  serial part, memory bandwidth), so the side that gains share gains less than predicted; the advice is a
  direction and a first guess, to be checked by a short run at the recommended split.
- **Overlapped steady state**: generation and training run side by side, so a step lasts as long as the
  busier pool, max(generation, training); the other pool idles for the difference.
- **One batch at a time on the rollout pool**: batches generate one after another (the replicas take
  calls in arrival order), so more `async_buffer` does not raise generation throughput; it only absorbs
  steps whose generation runs long. The buffer is chosen by replaying the measured steps through the
  feed's schedule (`replay_idle`) and taking the smallest depth within `tolerance` of the best: each batch
  more ahead is one more version of staleness.
- **No contention between pools**: each pool's time depends on its own share only. Pools that share
  cores or one GPU slow each other; measured busy times already include that at the current split.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Candidate",
    "SplitAdvice",
    "StepTimes",
    "advise",
    "busy_times",
    "candidates",
    "replay_idle",
]

MAX_BUFFER = 4
"""Deepest `async_buffer` considered: deeper only ages samples further."""


@dataclass(frozen=True)
class StepTimes:
    """Measured busy seconds per step of each pool (one entry per step, steady steps only), and the
    shares of the devices (CPUs, GPUs) each pool had while they were measured."""

    generation_s: tuple[float, ...]
    training_s: tuple[float, ...]
    rollout_share: float
    trainer_share: float

    def __post_init__(self) -> None:
        if not self.generation_s or len(self.generation_s) != len(self.training_s):
            raise ValueError("StepTimes: one generation and one training time per step, at least one step")
        if min(self.generation_s) < 0 or min(self.training_s) < 0:
            raise ValueError("StepTimes: busy times must be >= 0")
        if self.rollout_share <= 0 or self.trainer_share <= 0:
            raise ValueError("StepTimes: each pool's share must be > 0")

    @property
    def generation_work(self) -> float:
        """Mean share-seconds of generation per step (the work that the rollout's share divides)."""
        return statistics.fmean(self.generation_s) * self.rollout_share

    @property
    def training_work(self) -> float:
        """Mean share-seconds of training per step."""
        return statistics.fmean(self.training_s) * self.trainer_share

    def at(self, rollout_share: float, trainer_share: float) -> tuple[list[float], list[float]]:
        """Each step's generation and training time at another split (time proportional to 1/share)."""
        g = self.rollout_share / rollout_share
        t = self.trainer_share / trainer_share
        return [x * g for x in self.generation_s], [x * t for x in self.training_s]


@dataclass(frozen=True)
class Candidate:
    """One split: the shares, and the steady step and each pool's idle time per step expected there."""

    rollout_share: float
    trainer_share: float
    async_buffer: int
    step_s: float
    trainer_idle_s: float
    rollout_idle_s: float


@dataclass(frozen=True)
class SplitAdvice:
    """The recommended split (`best`), the current one as the model sees it, and every split considered."""

    best: Candidate
    current: Candidate
    considered: tuple[Candidate, ...]
    bound: str
    """Which pool limits the step at the current split: `generation-bound`, `training-bound` or
    `balanced` (busy times within 5%)."""

    def render(self, unit: str = "share", buffer: bool = True) -> str:
        """One line for the run log and `quartet plan` (`buffer`: name the recommended `async_buffer`)."""
        b, c = self.best, self.current
        speed = c.step_s / b.step_s if b.step_s > 0 else 1.0
        depth = f", async_buffer {c.async_buffer} -> {b.async_buffer}" if buffer else ""
        return (
            f"split advice ({self.bound} now): rollout:trainer {_num(c.rollout_share)}:"
            f"{_num(c.trainer_share)} {unit} -> {_num(b.rollout_share)}:{_num(b.trainer_share)}{depth}; "
            f"expected step {b.step_s:.3g} s (now {c.step_s:.3g} s, {speed:.2f}x), idle per step: trainer "
            f"{b.trainer_idle_s:.3g} s, rollout {b.rollout_idle_s:.3g} s (model: time ~ 1/share, overlapped)"
        )


def _num(x: float) -> str:
    return f"{x:g}"


def busy_times(records: Sequence[dict[str, object]]) -> tuple[list[float], list[float]]:
    """Each step record's (generation, training) busy seconds: the step's wall time minus each pool's
    idle time. Records without the pool metrics (a colocated run) are skipped."""
    gen, train = [], []
    for r in records:
        keys = ("timing_s/step", "timing_s/rollout_idle", "timing_s/trainer_idle")
        if all(isinstance(r.get(k), (int, float)) for k in keys):
            step = float(r["timing_s/step"])  # type: ignore[arg-type]
            gen.append(max(0.0, step - float(r["timing_s/rollout_idle"])))  # type: ignore[arg-type]
            train.append(max(0.0, step - float(r["timing_s/trainer_idle"])))  # type: ignore[arg-type]
    return gen, train


def replay_idle(generation_s: Sequence[float], training_s: Sequence[float], buffer: int) -> float:
    """Mean trainer idle per step when the measured steps (cycled) run through the async feed's schedule
    with `buffer` batches ahead: batch j is started when step j - buffer takes its batch (all of the first
    buffer + 1 at once), batches generate one after another, and step k waits until batch k is done and
    the trainer has finished step k - 1. The first buffer + 1 steps (the pipeline filling) are left out."""
    if buffer < 1:
        raise ValueError(f"replay_idle: buffer must be >= 1, got {buffer}")
    n = len(generation_s)
    steps = max(64, 8 * n) + buffer + 1
    take: list[float] = []
    done_prev = 0.0
    free = 0.0
    idle: list[float] = []
    for k in range(steps):
        submit = take[k - buffer] if k - buffer >= 1 else 0.0
        done = max(submit, done_prev) + generation_s[k % n]
        done_prev = done
        began = max(free, done)
        if k > buffer:
            idle.append(began - free)
        take.append(began)
        free = began + training_s[k % n]
    return statistics.fmean(idle)


def candidates(total: float, grain: float, minimum: float | None = None) -> list[tuple[float, float]]:
    """Every (rollout, trainer) split of `total` in steps of `grain`, each side at least `minimum` (one
    grain by default)."""
    if total <= 0 or grain <= 0:
        raise ValueError(f"candidates: total and grain must be > 0, got {total} and {grain}")
    low = grain if minimum is None else minimum
    count = int(math.floor(total / grain + 1e-9))
    out = []
    for i in range(1, count):
        r = round(i * grain, 9)
        t = round(total - r, 9)
        if r >= low - 1e-9 and t >= low - 1e-9:
            out.append((r, t))
    return out


def _evaluate(
    times: StepTimes, rollout: float, trainer: float, buffers: Sequence[int], tol: float
) -> Candidate:
    """The split (rollout, trainer) with the smallest buffer of `buffers` whose replayed trainer idle is
    within `tol` (a share of the step) of the least."""
    gen, train = times.at(rollout, trainer)
    idles = [(b, replay_idle(gen, train, b)) for b in buffers]
    least = min(i for _, i in idles)
    step_least = statistics.fmean(train) + least
    buffer, idle = next((b, i) for b, i in idles if i <= least + tol * step_least + 1e-12)
    step = statistics.fmean(train) + idle
    return Candidate(rollout, trainer, buffer, step, idle, max(0.0, step - statistics.fmean(gen)))


def advise(
    times: StepTimes,
    grain: float | None = 1.0,
    current_buffer: int = 2,
    buffers: Sequence[int] = tuple(range(1, MAX_BUFFER + 1)),
    tolerance: float = 0.02,
) -> SplitAdvice:
    """The split of the pools' total share (in steps of `grain`: 1 for whole CPUs or devices; None keeps the
    current split, where no other can be configured) and the buffer (of `buffers`; `(1,)` for
    one_step_off, whose depth is fixed) with the shortest expected step; among equal steps, the one
    closest to the current split. `tolerance`: a deeper buffer is taken only if it saves more than this
    share of the step in trainer idle time. `current`: the current split at `current_buffer` (or the
    deepest of `buffers` below it)."""
    total = times.rollout_share + times.trainer_share
    if not buffers or min(buffers) < 1:
        raise ValueError(f"advise: buffers must be >= 1, got {list(buffers)}")
    current_split = [(times.rollout_share, times.trainer_share)]
    splits = (candidates(total, grain) if grain is not None else []) or current_split
    considered = tuple(_evaluate(times, r, t, buffers, tolerance) for r, t in splits)
    shortest = min(c.step_s for c in considered)
    near = [c for c in considered if c.step_s <= shortest * (1 + 1e-9) + 1e-12]
    best = min(near, key=lambda c: abs(c.rollout_share - times.rollout_share))
    now = [b for b in buffers if b <= current_buffer] or [min(buffers)]
    current = _evaluate(times, times.rollout_share, times.trainer_share, [max(now)], tolerance)
    gen, train = statistics.fmean(times.generation_s), statistics.fmean(times.training_s)
    bound = (
        "balanced"
        if abs(gen - train) <= 0.05 * max(gen, train)
        else ("generation-bound" if gen > train else "training-bound")
    )
    return SplitAdvice(best, current, considered, bound)
