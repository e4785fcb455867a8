"""`FairQueues.submit_batched`: queued calls of one tag run as one `run_many`, in round-robin order, within
the row bound, each key keeping its order; a failing slot fails only its call."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from quartet.serving.tinker.queues import Batchable, FairQueues


class _Runs:
    """A real `run_many`: records each run's payloads and answers payload * 10 (an exception payload is
    returned as its slot's result; the payload "boom" fails the whole run)."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log

    def __call__(self, payloads: Sequence[Any]) -> list[Any]:
        self.log.append(list(payloads))
        if "boom" in payloads:
            raise OSError("the whole run failed")
        return [p if isinstance(p, BaseException) else p * 10 for p in payloads]


def _held(queues: FairQueues) -> threading.Event:
    gate = threading.Event()
    queues.submit("hold", gate.wait)  # holds the thread until everything is queued
    return gate


def test_calls_of_one_tag_from_several_keys_run_once_in_round_robin_order() -> None:
    queues = FairQueues("test-batch")
    log: list[Any] = []
    runs = _Runs(log)
    try:
        gate = _held(queues)
        fa = [queues.submit_batched("a", Batchable("s", p, runs)) for p in (1, 2, 3)]
        fb = [queues.submit_batched("b", Batchable("s", p, runs)) for p in (4,)]
        fc = [queues.submit_batched("c", Batchable("s", p, runs)) for p in (5, 6)]
        other = queues.submit_batched("d", Batchable("other-base", 7, runs))
        gate.set()
        got = [f.result(timeout=10) for f in fa + fb + fc]
        assert other.result(timeout=10) == 70
    finally:
        queues.shutdown()
    assert got == [10, 20, 30, 40, 50, 60]  # each future has its own slot
    # a1 first, then one head per key per round (b, c, a), then the rest: another tag runs apart
    assert log == [[1, 4, 5, 2, 6, 3], [7]]
    assert queues.batch_sizes() == [1, 6, 1]


def test_a_keys_later_plain_call_splits_its_batch_and_order_holds() -> None:
    queues = FairQueues("test-order")
    ran: list[Any] = []
    runs = _Runs(ran)
    try:
        gate = _held(queues)
        futures = [
            queues.submit_batched("a", Batchable("s", 1, runs)),
            queues.submit("a", lambda: ran.append("a-train")),
            queues.submit_batched("a", Batchable("s", 2, runs)),
            queues.submit_batched("b", Batchable("s", 3, runs)),
        ]
        gate.set()
        for future in futures:
            future.result(timeout=10)
    finally:
        queues.shutdown()
    # a's second sample never runs before its training call, b's joins a's first
    assert ran == [[1, 3], "a-train", [2]]


def test_the_row_bound_splits_runs() -> None:
    queues = FairQueues("test-rows", max_batch_rows=5)
    log: list[Any] = []
    runs = _Runs(log)
    try:
        gate = _held(queues)
        futures = [queues.submit_batched(k, Batchable("s", p, runs, rows=2)) for k, p in
                   [("a", 1), ("b", 2), ("c", 3), ("d", 4)]]  # fmt: skip
        big = queues.submit_batched("e", Batchable("s", 9, runs, rows=50))  # over the bound alone: runs alone
        gate.set()
        assert [f.result(timeout=10) for f in futures] == [10, 20, 30, 40]
        assert big.result(timeout=10) == 90
    finally:
        queues.shutdown()
    assert log == [[1, 2], [3, 4], [9]]


def test_a_failing_slot_fails_only_its_call_and_a_failing_run_fails_its_calls_only() -> None:
    queues = FairQueues("test-batch-fail")
    runs = _Runs([])
    try:
        gate = _held(queues)
        good = queues.submit_batched("a", Batchable("s", 1, runs))
        bad = queues.submit_batched("b", Batchable("s", ValueError("slot b"), runs))
        gate.set()
        assert good.result(timeout=10) == 10
        with pytest.raises(ValueError, match="slot b"):
            bad.result(timeout=10)
        gate = _held(queues)
        doomed = [queues.submit_batched(k, Batchable("s", p, runs)) for k, p in [("a", 2), ("b", "boom")]]
        after = queues.submit("a", lambda: "still serving")
        gate.set()
        for future in doomed:
            with pytest.raises(OSError, match="whole run"):
                future.result(timeout=10)
        assert after.result(timeout=10) == "still serving"
    finally:
        queues.shutdown()


def test_a_dropped_keys_calls_leave_the_batch() -> None:
    queues = FairQueues("test-batch-drop")
    log: list[Any] = []
    runs = _Runs(log)
    try:
        gate = _held(queues)
        kept = queues.submit_batched("a", Batchable("s", 1, runs))
        gone = queues.submit_batched("b", Batchable("s", 2, runs))
        assert queues.drop("b") == 1
        gate.set()
        assert kept.result(timeout=10) == 10
    finally:
        queues.shutdown()
    assert gone.cancelled()
    assert log == [[1]]
