"""The request thread shared by the rollout engines: submit, wait, abort, stop, and no wait on a dead thread
hangs. First on the bare class with a toy step, then on the built-in engine with a real tiny model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest
from rollout_cases import prompt_ids, shared_model

from quartet.rollout import (
    EngineStateError,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TorchRolloutEngine,
)
from quartet.rollout.engine_thread import EngineThread, settle

HANG_GUARD_S = 60  # a bound on waits that must end: far above what they take, so only a hang reaches it


class _Fatal(BaseException):
    """Not an Exception: nothing in a step catches it, so it ends the engine thread."""


class Doubler:
    """A toy engine: each submitted (id, number) is answered with twice the number at the next step."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.futures: dict[str, Future[int]] = {}
        self.aborted: list[str] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on
        self.worker: EngineThread[tuple[str, int]] = EngineThread(
            "toy-engine", step=self.step, has_work=lambda: False, on_death=self.fail_all
        )

    def submit(self, request_id: str, number: int) -> Future[int]:
        future: Future[int] = Future()

        def admit() -> None:
            if request_id in self.futures:
                raise ValueError(f"{request_id} is already in flight")
            self.futures[request_id] = future

        self.worker.submit((request_id, number), admit)
        return future

    def step(self, inbox: list[tuple[str, int]], aborts: list[str]) -> None:
        self.threads.add(threading.current_thread().name)
        self.aborted += aborts
        for request_id, number in inbox:
            if number == self.fail_on:
                raise _Fatal(f"fatal on {number}")
            with self.worker.cond:
                future = self.futures.pop(request_id)
            settle(future, 2 * number)

    def fail_all(self, error: EngineStateError) -> None:
        with self.worker.cond:
            futures, self.futures = self.futures, {}
        for future in futures.values():
            settle(future, error=error)


def bounded(call: Callable[[], object]) -> object:
    """`call`'s result or exception, from a helper thread; fails the test if it does not end (a hang)."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:
            box.append(exc)

    helper = threading.Thread(target=run, daemon=True)
    helper.start()
    helper.join(HANG_GUARD_S)
    assert not helper.is_alive(), "the wait hung"
    return box[0]


def test_submit_wait_abort_and_stop() -> None:
    toy = Doubler()
    assert not toy.worker.is_alive()  # started lazily, by the first submission
    results = [toy.worker.wait(toy.submit(f"r{i}", i), timeout=HANG_GUARD_S) for i in range(5)]
    assert results == [0, 2, 4, 6, 8]
    assert toy.threads == {"toy-engine"}  # the steps ran on the engine's own thread
    assert asyncio.run(toy.worker.wait_async(toy.submit("async", 21), timeout=HANG_GUARD_S)) == 42
    toy.worker.abort("r9")
    assert toy.worker.wait(toy.submit("after-abort", 1), timeout=HANG_GUARD_S) == 2
    assert toy.aborted == ["r9"]
    assert toy.worker.stop(timeout=HANG_GUARD_S)
    assert not toy.worker.is_alive()
    with pytest.raises(EngineStateError, match="shut down"):
        toy.submit("late", 1)
    assert toy.worker.stop()  # idempotent


def test_a_refused_submission_queues_nothing() -> None:
    toy = Doubler()
    blocked = Future[int]()
    toy.futures["taken"] = blocked  # as if "taken" were in flight
    with pytest.raises(ValueError, match="already in flight"):
        toy.submit("taken", 1)
    assert not toy.worker.has_queued() and not toy.worker.is_alive()
    toy.worker.stop()


def test_a_wait_times_out_while_the_thread_lives() -> None:
    toy = Doubler()
    toy.worker.wait(toy.submit("start", 1), timeout=HANG_GUARD_S)  # the thread is up
    never: Future[int] = Future()  # nothing will settle it
    assert isinstance(bounded(lambda: toy.worker.wait(never, timeout=0.2)), TimeoutError)
    result = bounded(lambda: asyncio.run(toy.worker.wait_async(never, timeout=0.2)))
    assert isinstance(result, TimeoutError)
    assert toy.worker.is_alive()
    toy.worker.stop()


def test_waiters_of_a_dead_thread_get_its_failure() -> None:
    toy = Doubler(fail_on=13)
    assert toy.worker.wait(toy.submit("ok", 1), timeout=HANG_GUARD_S) == 2
    doomed = toy.submit("doomed", 13)
    result = bounded(lambda: toy.worker.wait(doomed))  # no timeout of its own: only liveness ends it
    assert isinstance(result, EngineStateError)
    assert "toy-engine thread died" in str(result) and "fatal on 13" in str(result)
    toy.worker.join(HANG_GUARD_S)
    assert isinstance(toy.worker.error, _Fatal)
    with pytest.raises(EngineStateError, match="fatal on 13"):  # later submissions are refused at once
        toy.submit("next", 2)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_wait_on_a_thread_that_stopped_silently_fails(
    use_async: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    toy = Doubler()
    monkeypatch.setattr(toy.worker, "_serve", lambda: None)  # the loop ends at once, settling nothing
    future = toy.submit("lost", 1)
    if use_async:
        result = bounded(lambda: asyncio.run(toy.worker.wait_async(future)))
    else:
        result = bounded(lambda: toy.worker.wait(future))
    assert isinstance(result, EngineStateError) and "stopped unexpectedly" in str(result)
    assert not future.done()  # nothing settled it: only the liveness check ended the wait


def test_a_cancelled_async_wait_runs_on_cancel() -> None:
    toy = Doubler()
    toy.worker.wait(toy.submit("start", 1), timeout=HANG_GUARD_S)
    cancelled: list[bool] = []
    never: Future[int] = Future()

    async def cancel_it() -> None:
        task = asyncio.create_task(toy.worker.wait_async(never, on_cancel=lambda: cancelled.append(True)))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert cancelled == [True]
    toy.worker.stop()


def test_settle_skips_a_cancelled_future() -> None:
    future: Future[int] = Future()
    assert future.cancel()
    settle(future, 3)  # no InvalidStateError: the caller gave up, nothing to deliver
    assert future.cancelled()


# ---- the built-in engine on its real classes ------------------------------------------------------------


def test_the_builtin_engine_fails_waits_when_its_thread_dies(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=4)
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=4, seed=0, ignore_eos=True)
    assert len(engine.generate([GenerationRequest(prompt, sampling)])[0][0].token_ids) == 4

    def fatal() -> list[object]:
        raise _Fatal("engine step killed")

    monkeypatch.setattr(engine.core, "step", fatal)
    batch = bounded(lambda: engine.generate([GenerationRequest(prompt, sampling)]))
    assert isinstance(batch, EngineStateError)
    assert "quartet-rollout thread died" in str(batch) and "engine step killed" in str(batch)
    single = bounded(lambda: asyncio.run(engine.generate_one(GenerationRequest(prompt, sampling))))
    assert isinstance(single, EngineStateError) and "engine step killed" in str(single)
    engine.shutdown()  # still ends cleanly


def test_the_builtin_engine_shutdown_aborts_work_in_flight(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=2)
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    stepping, release = threading.Event(), threading.Event()
    original = engine.core.step

    def held_step() -> list[object]:  # the first step waits until shutdown has begun
        stepping.set()
        release.wait(HANG_GUARD_S)
        return original()  # type: ignore[return-value]

    monkeypatch.setattr(engine.core, "step", held_step)
    sampling = SamplingParams(max_new_tokens=50, ignore_eos=True, seed=0, n=2)
    future = engine._submit(GenerationRequest(prompt, sampling))
    assert stepping.wait(HANG_GUARD_S)
    closer = threading.Thread(target=engine.shutdown, daemon=True)
    closer.start()
    while not engine._thread.closing and closer.is_alive():
        closer.join(0.01)
    release.set()
    closer.join(HANG_GUARD_S)
    assert not closer.is_alive(), "shutdown hung"
    outputs = future.result(timeout=HANG_GUARD_S)
    assert [o.finish_reason for o in outputs] == [FinishReason.ABORT] * 2
    assert all(1 <= len(o.token_ids) < 50 for o in outputs)  # the tokens of the step that ran
    with pytest.raises(EngineStateError, match="shut down"):
        engine.generate([GenerationRequest(prompt, sampling)])
