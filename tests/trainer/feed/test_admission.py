"""Admission control of the async feed (`quartet.trainer.feed.admission`), without a cluster.

The gate against hand-computed cases; then the real `RolloutFeed` driven by a simulated rollout pool on a
simulated clock: one replica generating the submitted batches in order, one token per tick per response,
some prompts 10x longer than the others (by their dataset index, so it is decided, not sampled), every
token tagged with the weight version the replica held at its tick, and the trainer syncing a new version
after each step's training time. The bound is checked on every consumed token from those tags, and every
prompt is recounted: each drawn exactly once per epoch.
"""

from __future__ import annotations

import bisect
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from quartet.core.batch import Batch
from quartet.data.sampler import PromptSampler
from quartet.trainer.feed import rollout_feed
from quartet.trainer.feed.admission import AdmissionGate
from quartet.trainer.feed.rollout_feed import RolloutFeed
from quartet.trainer.records.phase_timer import PhaseTimer

LONG, SHORT = 40, 4  # ticks (tokens) of a long and a short response
N = 2  # responses per prompt


def test_the_gate_admits_steps_within_the_bound_and_the_buffer() -> None:
    gate = AdmissionGate(max_staleness=1, buffer=2)
    assert gate.ahead == 1
    assert gate.admits(5, taking=5) and gate.admits(6, taking=5) and not gate.admits(7, taking=5)
    assert gate.group_limit(groups_per_step=4) == 8  # (1 + 1) x 4 in flight + buffered

    deeper = AdmissionGate(max_staleness=3, buffer=2)  # the buffer is the tighter cap
    assert deeper.ahead == 2 and deeper.admits(7, taking=5) and not deeper.admits(8, taking=5)
    assert deeper.group_limit(4) == 12

    on_policy = AdmissionGate(max_staleness=0, buffer=2)  # a step starts when it is taken
    assert on_policy.ahead == 0 and on_policy.admits(5, taking=5) and not on_policy.admits(6, taking=5)
    assert on_policy.group_limit(8) == 8

    off = AdmissionGate(max_staleness=None, buffer=3)  # the drop policy: the buffer alone
    assert off.ahead == 3 and off.admits(8, taking=5) and off.group_limit(4) is None


def test_the_gate_refuses_bad_arguments_and_counts_the_first_hold() -> None:
    with pytest.raises(ValueError, match="before the step being taken"):
        AdmissionGate(1, 2).admits(4, taking=5)
    with pytest.raises(ValueError, match="max_staleness"):
        AdmissionGate(-1, 2)
    with pytest.raises(ValueError, match="buffer"):
        AdmissionGate(1, 0)
    gate = AdmissionGate(1, 2)
    gate.hold(7, 10.0)
    gate.hold(7, 12.0)  # held again at a later take: the wait runs from the first refusal
    assert gate.start(7, 15.5) == pytest.approx(5.5)
    assert gate.start(7, 20.0) == 0.0  # counted once
    assert gate.start(8, 3.0) == 0.0  # never held


def _length(index: int) -> int:
    return LONG if index % 4 == 0 else SHORT


@dataclass
class _SimPool:
    """One rollout replica on a simulated clock (ticks); `syncs[i]` is the tick version i + 1 landed."""

    clock: float = 0.0
    free_at: float = 0.0
    syncs: list[float] = field(default_factory=list)

    def version_at(self, tick: float) -> int:
        return bisect.bisect_right(self.syncs, tick)

    def submit_batch(self, method: Any, prompts: Batch) -> _SimPending:
        start = max(self.clock, self.free_at)
        self.free_at = start + max(_length(int(i)) for i in prompts.non_tensors["index"])
        return _SimPending(self, prompts, start)

    def call_batch(self, method: Any, prompts: Batch, first: bool = False) -> Batch:
        assert first  # the drop policy's regeneration goes ahead of the queue and is waited for
        pending = _SimPending(self, prompts, self.clock)
        took = max(_length(int(i)) for i in prompts.non_tensors["index"])
        self.free_at = max(self.free_at, self.clock) + took
        self.clock += took
        return pending.get()


@dataclass
class _SimPending:
    pool: _SimPool
    prompts: Batch
    start: float

    def get(self) -> Batch:
        """The batch, its tokens tagged with the version at their tick (every sync up to the batch's end is
        known: the trainer waits here, so none lands meanwhile)."""
        indices = [int(i) for i in self.prompts.non_tensors["index"]]
        self.pool.clock = max(self.pool.clock, self.start + max(_length(i) for i in indices))
        rows = [i for i in indices for _ in range(N)]
        mask = torch.zeros(len(rows), LONG, dtype=torch.int64)
        versions = torch.zeros(len(rows), LONG, dtype=torch.int64)
        for r, index in enumerate(rows):
            for t in range(_length(index)):
                mask[r, t] = 1
                versions[r, t] = self.pool.version_at(self.start + t)
        uids = np.repeat(np.asarray(self.prompts.non_tensors["uid"], dtype=object), N)
        columns = {
            "prompts": torch.tensor(rows).unsqueeze(1),
            "attention_mask": torch.cat([torch.ones(len(rows), 1, dtype=torch.int64), mask], dim=1),
            "response_mask": mask,
            "rollout_versions": versions,
        }
        return Batch(columns, {"uid": uids, "index": np.asarray(rows, dtype=object)})

    def raise_if_failed(self) -> None:
        """A simulated generation never fails (failures are test_replica_recovery.py's)."""


class _Scorer:
    def score_rollout(self, batch: Batch, timer: PhaseTimer) -> tuple[Batch, dict[str, float]]:
        return batch, {}


@dataclass
class _Run:
    lags: list[int]
    metrics: list[dict[str, float]]
    take_ticks: list[float]
    indices: list[list[int]]


def _simulate(
    monkeypatch: pytest.MonkeyPatch, max_staleness: int, buffer: int, admission: bool, train: float = 12.0
) -> _Run:
    """24 steps of 4 prompts (3 epochs of 32), `train` ticks of training then a sync after each step."""
    pool = _SimPool()
    monkeypatch.setattr(rollout_feed, "time", types.SimpleNamespace(time=lambda: pool.clock))
    sampler = PromptSampler(32, 4, shuffle=True, seed=3)

    def draw(step: int, k: int) -> Batch:
        idx = sampler.next_indices()
        uids = np.asarray([f"{step}-{i}" for i in idx], dtype=object)
        return Batch({"prompts": torch.tensor(idx).unsqueeze(1)}, {"uid": uids, "index": np.asarray(idx)})

    workers: Any = types.SimpleNamespace(rollout=pool)
    scorer: Any = _Scorer()
    feed = RolloutFeed(workers, scorer, draw, sampler.state_dict, buffer, max_staleness, 24, 0, admission)
    run = _Run([], [], [], [])
    for step in range(1, 25):
        version = step - 1  # one update, then one sync, per step
        run.take_ticks.append(pool.clock)
        got = feed.take(step, version, PhaseTimer())
        mask = got.batch["response_mask"].bool()
        lag = version - got.batch["rollout_versions"][mask]
        assert int(lag.min()) >= 0, f"step {step}: a token from the future"
        run.lags.append(int(lag.max()))
        run.metrics.append(got.metrics)
        run.indices.append(sorted({int(i) for i in got.batch.non_tensors["index"]}))
        pool.clock += train
        pool.syncs.append(pool.clock)
    return run


def _each_prompt_once_per_epoch(run: _Run) -> None:
    for epoch in range(3):
        drawn = Counter(i for step in run.indices[epoch * 8 : epoch * 8 + 8] for i in step)
        assert drawn == Counter(range(32)), f"epoch {epoch}: {drawn}"


@pytest.mark.parametrize(("max_staleness", "buffer"), [(0, 2), (1, 2), (2, 2), (1, 3), (3, 2), (2, 4)])
def test_admission_keeps_every_consumed_token_within_the_bound(
    monkeypatch: pytest.MonkeyPatch, max_staleness: int, buffer: int
) -> None:
    run = _simulate(monkeypatch, max_staleness, buffer, admission=True, train=30.0)
    assert max(run.lags) == min(max_staleness, buffer)  # within the bound, and the bound is reached
    assert all(m["async/dropped_stale"] == 0 for m in run.metrics)
    assert run.metrics[-1]["async/dropped_stale_total"] == 0
    assert [m["async/staleness_max"] for m in run.metrics] == run.lags
    _each_prompt_once_per_epoch(run)


def test_the_buffer_alone_breaks_the_bound_on_the_same_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drop policy on the schedule admission keeps: the buffer alone would train on tokens two
    versions old (they are dropped and regenerated instead), so the schedule does test the rule."""
    run = _simulate(monkeypatch, max_staleness=1, buffer=2, admission=False, train=30.0)
    assert max(run.lags) <= 1
    assert run.metrics[-1]["async/dropped_stale_total"] > 0
    _each_prompt_once_per_epoch(run)


def test_admission_wait_is_how_long_the_buffer_had_room_for_a_held_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bound 1, buffer 2: the buffer would start step k + 1 while step k - 1 is taken; admission starts it
    # while step k is taken, so it waits the time between those two takes
    run = _simulate(monkeypatch, max_staleness=1, buffer=2, admission=True, train=12.0)
    waits = [m["async/admission_wait_s"] for m in run.metrics]
    expected = [0.0] + [run.take_ticks[k] - run.take_ticks[k - 1] for k in range(1, 23)] + [0.0]
    assert waits == pytest.approx(expected)
    assert min(expected[1:-1]) >= 12.0  # at least a step's training apart
    # no wait where the bound is not the tighter cap
    deep = _simulate(monkeypatch, max_staleness=2, buffer=2, admission=True, train=12.0)
    assert all(m["async/admission_wait_s"] == 0.0 for m in deep.metrics)
