"""The parts of the overlapped modes that need no cluster: busy/overlap arithmetic (`busy_time`) against a
brute-force timeline, the staleness helpers against a per-token recount, the in-order generation lock, and the
weight versions a multi-turn trajectory keeps."""

from __future__ import annotations

import random
import threading
import time

import torch

from quartet.agents.batch import trajectories_to_batch
from quartet.agents.trajectory import Trajectory
from quartet.core.batch import Batch
from quartet.roles.weight_stream import GenerationLock
from quartet.trainer.feed.rollout_feed import stale_groups, staleness_metrics
from quartet.trainer.records.busy_time import busy_outside, busy_seconds, overlap_seconds, pool_metrics

TICK = 0.01


def _timeline(intervals: list[tuple[float, float]], window: tuple[float, float]) -> list[bool]:
    """Whether some interval covers each tick of the window (ticks at their midpoints)."""
    ticks = round((window[1] - window[0]) / TICK)
    return [any(a <= window[0] + (i + 0.5) * TICK < b for a, b in intervals) for i in range(ticks)]


def _random_intervals(rng: random.Random) -> list[tuple[float, float]]:
    out = []
    for _ in range(rng.randint(0, 6)):
        a = rng.randint(-20, 120) * TICK
        out.append((a, a + rng.randint(1, 40) * TICK))
    return out


def test_busy_and_overlap_match_a_brute_force_timeline() -> None:
    rng = random.Random(0)
    window = (0.0, 1.0)
    for _ in range(200):
        first, second = _random_intervals(rng), _random_intervals(rng)
        a, b = _timeline(first, window), _timeline(second, window)
        assert abs(busy_seconds(first, window) - sum(a) * TICK) < 1e-9
        both = sum(x and y for x, y in zip(a, b, strict=True))
        assert abs(overlap_seconds(first, second, window) - both * TICK) < 1e-9
        metrics = pool_metrics(first, second, window)
        assert abs(metrics["timing_s/trainer_idle"] - (len(a) - sum(a)) * TICK) < 1e-9
        assert abs(metrics["timing_s/rollout_idle"] - (len(b) - sum(b)) * TICK) < 1e-9


def test_the_trainer_is_busy_exactly_outside_its_waits() -> None:
    rng = random.Random(1)
    window = (0.0, 1.0)
    for _ in range(200):
        waits = _random_intervals(rng)
        waiting, busy = _timeline(waits, window), _timeline(busy_outside(waits, window), window)
        assert busy == [not w for w in waiting]


def _rollout(versions: list[list[int]], mask: list[list[int]], uids: list[str]) -> Batch:
    return Batch(
        {"rollout_versions": torch.tensor(versions), "response_mask": torch.tensor(mask)}, {"uid": uids}
    )


def test_stale_groups_and_staleness_count_model_tokens_only() -> None:
    batch = _rollout(
        versions=[[5, 6, 0], [6, 6, 6], [3, 6, 6], [6, 6, 6]],  # the 0 is padding; the 3 is model-written
        mask=[[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]],
        uids=["g1", "g1", "g2", "g2"],
    )
    assert stale_groups(batch, version=6, max_staleness=2) == {"g2"}  # lag 3 > 2
    assert stale_groups(batch, version=6, max_staleness=3) == set()
    lags = [1, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0]  # per model-written token, recounted by hand
    metrics = staleness_metrics(batch, version=6)
    assert metrics["async/staleness_max"] == 3
    assert abs(metrics["async/staleness_mean"] - sum(lags) / len(lags)) < 1e-12
    assert metrics["async/spanning_updates"] == 2 / 4  # rows 0 (5, 6) and 2 (3, 6) span two versions


def test_generation_lock_serves_in_arrival_order() -> None:
    lock, order = GenerationLock(), []
    lock.acquire()
    assert not lock.acquire(blocking=False)  # held: an idle check fails

    def worker(i: int) -> None:
        with lock:
            order.append(i)

    threads = []
    for i in range(6):
        t = threading.Thread(target=worker, args=(i,))
        t.start()
        threads.append(t)
        time.sleep(0.02)  # each one queued before the next arrives
    lock.release()
    for t in threads:
        t.join(10)
    assert order == list(range(6))
    assert lock.acquire(blocking=False)  # nobody holds or waits
    lock.release()


def test_generation_lock_lets_a_regeneration_go_first() -> None:
    lock, order = GenerationLock(), []
    lock.acquire()

    def worker(name: str, first: bool) -> None:
        lock.acquire(first=first)
        try:
            order.append(name)
        finally:
            lock.release()

    threads = []
    for name, first in [("batch 5", False), ("batch 6", False), ("stale group", True)]:
        t = threading.Thread(target=worker, args=(name, first))
        t.start()
        threads.append(t)
        time.sleep(0.02)
    lock.release()
    for t in threads:
        t.join(10)
    assert order == ["stale group", "batch 5", "batch 6"]


def test_trajectory_keeps_each_turns_versions() -> None:
    t = Trajectory([1, 2], [])
    t.add_model_turn([10, 11], [-0.1, -0.2], versions=(3, 3))
    t.add_env_turn("tool", [20, 21, 22])
    t.add_model_turn([12], [-0.3], versions=(4,))  # a weight update landed between the turns
    assert t.versions == [3, 3, 0, 0, 0, 4]
    batch = trajectories_to_batch(Batch({}, {"uid": ["u"]}, batch_size=1), [t], 1, 0, 8)
    assert batch["rollout_versions"][0].tolist() == [3, 3, 0, 0, 0, 4, 0, 0]
    untagged = Trajectory([1], [])
    untagged.add_model_turn([5], None)
    assert untagged.versions is None
