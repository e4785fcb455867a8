"""The request thread shared by the in-process rollout engines (built-in and vLLM).

An engine's model is stepped by one background thread; callers submit work to its inbox and wait on
futures, so a batch call and many concurrent agent-loop calls feed the same running batch. This class owns
that thread and its lifecycle, written once so the two engines cannot drift apart again:

- submit: checked and queued under one lock; the thread starts lazily with the first submission;
- the loop: sleeps until there is queued work, an abort or work in flight, then runs one engine step
  under `step_lock` (weight loads and sleep/wake take the same lock, so they fall between two steps);
- waits poll the thread's liveness: a caller whose engine thread died gets `EngineStateError` naming the
  thread's failure instead of hanging, and a wait with a timeout raises `TimeoutError` when it runs out;
- death: an exception escaping a step (a BaseException: the engines catch ordinary ones per request) is
  recorded, and the engine's `on_death` fails every request in flight;
- stop: join with a timeout, so a wedged step cannot hang shutdown.

What a step does, and the per-request bookkeeping (futures by request id, partial samples), stay in each
engine: the built-in one steps `EngineCore`, the vLLM one steps vLLM's `LLMEngine`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from quartet.rollout.base import EngineStateError

__all__ = ["EngineThread", "settle"]

log = logging.getLogger(__name__)

W = TypeVar("W")  # one submitted unit of work, as the engine queues it
R = TypeVar("R")

LIVENESS_POLL_S = 1.0  # how often a waiting caller checks that the engine thread is still alive
JOIN_TIMEOUT_S = 60.0  # how long `stop` waits for a step in progress to end


def settle(future: Future[R], result: R | None = None, error: BaseException | None = None) -> None:
    """Set a caller's result or error, unless the caller cancelled it (set_result would then raise)."""
    if not future.set_running_or_notify_cancel():  # cancelled; else RUNNING, so no cancel can race us
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]  # None only where R allows it


def _poll_s(deadline: float | None) -> float:
    """Seconds until the next liveness check of a wait: the poll interval, or less near its deadline."""
    if deadline is None:
        return LIVENESS_POLL_S
    return max(0.0, min(LIVENESS_POLL_S, deadline - time.monotonic()))


class EngineThread(Generic[W]):
    """One engine's request thread: an inbox, aborts, the step loop, liveness-checked waits and stop."""

    def __init__(
        self,
        name: str,
        *,
        step: Callable[[list[W], list[str]], None],
        has_work: Callable[[], bool],
        on_death: Callable[[EngineStateError], None],
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """name: the thread's name (in errors and logs). step(inbox, aborts): one engine step over the newly
        submitted work and the request ids to abort, run under `step_lock`. has_work: whether requests are
        in flight (read under `cond`), so the loop keeps stepping with an empty inbox. on_death(error):
        fail every pending request, called on the dying thread. on_start: run first on the new thread
        (e.g. its torch thread count, which is per thread).
        """
        self.name = name
        self.cond = threading.Condition()
        """Guards the inbox, the aborts and the closing flag; engines guard their pending maps with it."""
        self.step_lock = threading.Lock()
        """Held for each step; take it to change the model between two steps."""
        self.closing = False
        self.error: BaseException | None = None  # why the thread died, once it has
        self._step = step
        self._has_work = has_work
        self._on_death = on_death
        self._on_start = on_start
        self._inbox: list[W] = []
        self._aborts: list[str] = []
        self._thread: threading.Thread | None = None

    # ---- callers ------------------------------------------------------------------------------------------

    def submit(self, work: W, admit: Callable[[], None] | None = None) -> None:
        """Queue `work` (starting the thread on first use); `admit` runs under `cond` first and may refuse.

        Raises `EngineStateError` once stopping or after the thread died; whatever `admit` raises leaves
        nothing queued.
        """
        with self.cond:
            if self.closing:
                raise EngineStateError("the engine is shut down")
            self.check_alive()
            if admit is not None:
                admit()
            self._inbox.append(work)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self.cond.notify()

    def abort(self, request_id: str) -> None:
        """Ask the next step to stop `request_id`."""
        with self.cond:
            self._aborts.append(request_id)
            self.cond.notify()

    def wait(self, future: Future[R], timeout: float | None = None) -> R:
        """The future's result; `EngineStateError` if the thread dies first, TimeoutError after `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return future.result(timeout=_poll_s(deadline))
            except TimeoutError:  # concurrent.futures.TimeoutError is this builtin since Python 3.11
                if not future.done():  # else it was settled just now: the next try returns it
                    self._check_wait(deadline, timeout)

    async def wait_async(
        self,
        future: Future[R],
        timeout: float | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> R:
        """`wait` for an event loop; `on_cancel` runs when the awaiting task is cancelled (e.g. an abort)."""
        wrapped = asyncio.wrap_future(future)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                done, _ = await asyncio.wait({wrapped}, timeout=_poll_s(deadline))
                if done:
                    return wrapped.result()
                self._check_wait(deadline, timeout)
        except asyncio.CancelledError:
            if on_cancel is not None:
                on_cancel()
            raise

    def _check_wait(self, deadline: float | None, timeout: float | None) -> None:
        """Between two polls of a wait: fail if the thread died, or if the wait's time is up."""
        self.check_alive()
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no result from the {self.name} thread in {timeout} s")

    def check_alive(self) -> None:
        """Raise `EngineStateError` naming the thread's failure when it has stopped without being asked."""
        thread = self._thread
        if thread is not None and not thread.is_alive() and not self.closing:
            raise self.death_error()

    def death_error(self) -> EngineStateError:
        """The error a caller of a dead thread gets: it names the thread and why it died."""
        if self.error is None:
            return EngineStateError(f"the {self.name} thread stopped unexpectedly")
        return EngineStateError(f"the {self.name} thread died: {self.error!r}")

    def has_queued(self) -> bool:
        """Whether submitted work still waits for the thread (call under `cond`)."""
        return bool(self._inbox)

    def take_queued(self) -> list[W]:
        """Remove and return the work no step took (after `stop`, or when failing everything)."""
        with self.cond:
            inbox, self._inbox = self._inbox, []
        return inbox

    def is_alive(self) -> bool:
        """Whether the thread has started and not ended."""
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after `stop`, or once it died); no-op before it started."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self, timeout: float = JOIN_TIMEOUT_S) -> bool:
        """Stop accepting work and end the loop; False (and a warning) when it did not end in `timeout`.

        Idempotent; the caller then settles what is left (`take_queued`, its own pending map).
        """
        with self.cond:
            self.closing = True
            self.cond.notify()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the %s thread did not stop within %.0f s", self.name, timeout)
            return False
        return True

    # ---- the thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._on_start is not None:
                self._on_start()
            self._serve()
        except BaseException as exc:  # the thread dies: fail its waiters rather than leave them hanging
            self.error = exc
            log.exception("the %s thread died; failing every request in flight", self.name)
            self._on_death(self.death_error())

    def _serve(self) -> None:
        while True:
            with self.cond:
                while not (self._inbox or self._aborts or self.closing or self._has_work()):
                    self.cond.wait()
                if self.closing:
                    return
                inbox, self._inbox = self._inbox, []
                aborts, self._aborts = self._aborts, []
            with self.step_lock:
                self._step(inbox, aborts)
