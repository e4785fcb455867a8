"""`FairQueues`: clients take turns on one thread, each keeps its order, a full queue refuses."""

from __future__ import annotations

import threading
import time

import pytest

from quartet.serving.tinker.queues import FairQueues, QueueFull


def test_clients_take_turns_and_each_keeps_its_order() -> None:
    queues = FairQueues("test-fair", max_queued_per_key=16)
    gate = threading.Event()
    ran: list[str] = []
    try:
        queues.submit("hold", gate.wait)  # holds the thread until everything is queued
        futures = [queues.submit("a", lambda i=i: ran.append(f"a{i}")) for i in range(4)]
        futures += [queues.submit("b", lambda i=i: ran.append(f"b{i}")) for i in range(2)]
        gate.set()
        for future in futures:
            future.result(timeout=10)
    finally:
        queues.shutdown()
    # round robin: b's two calls do not wait behind all four of a's
    assert ran == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_a_full_queue_refuses_and_others_are_unharmed() -> None:
    queues = FairQueues("test-full", max_queued_per_key=2)
    gate = threading.Event()
    try:
        queues.submit("hold", gate.wait)
        queues.submit("greedy", lambda: 1)
        queues.submit("greedy", lambda: 2)
        with pytest.raises(QueueFull, match="2 requests of greedy are already queued"):
            queues.submit("greedy", lambda: 3)
        polite = queues.submit("polite", lambda: "ok")
        gate.set()
        assert polite.result(timeout=10) == "ok"
    finally:
        queues.shutdown()


def test_a_failing_call_fails_only_its_future() -> None:
    queues = FairQueues("test-fail")
    try:
        bad = queues.submit("a", lambda: 1 / 0)
        good = queues.submit("a", lambda: 42)
        with pytest.raises(ZeroDivisionError):
            bad.result(timeout=10)
        assert good.result(timeout=10) == 42
    finally:
        queues.shutdown()


def test_shutdown_cancels_queued_calls_and_lets_the_running_one_finish() -> None:
    queues = FairQueues("test-stop")
    gate = threading.Event()
    running = queues.submit("a", lambda: gate.wait(10))
    queued = queues.submit("a", lambda: "never")
    deadline = time.monotonic() + 30
    while not running.running() and time.monotonic() < deadline:  # it must run before the stop begins
        time.sleep(0.01)
    threading.Timer(0.2, gate.set).start()
    queues.shutdown(timeout_s=10)
    assert running.result(timeout=1) is True
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="shutting down"):
        queues.submit("a", lambda: None)
