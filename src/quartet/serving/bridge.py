"""Awaits the engine on a private event loop, so that no caller can cancel an engine call.

Why: an engine's `generate_one` awaits a future that the engine's own thread completes. Cancelling that
await (a caller's timeout, a client that hangs up, `asyncio.run` cancelling leftover tasks as it returns)
cancels the engine's future, and the built-in engine's thread then fails when it delivers the result to a
cancelled future. Timeouts must therefore stop a request with `engine.abort(request_id)`, never by
cancellation. `EngineBridge.submit` runs each `generate_one` on one long-lived loop in a daemon thread,
which nothing cancels; the caller waits on a future of its own loop (`wait_in_loop`), copied from the
result and safe to cancel or to leave behind when that loop closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future
from typing import TypeVar

from quartet.rollout.base import RolloutEngine
from quartet.rollout.types import GenerationOutput, GenerationRequest

__all__ = ["EngineBridge", "wait_in_loop"]

T = TypeVar("T")


class EngineBridge:
    """Runs `engine.generate_one` calls on a private loop thread (started on first use)."""

    def __init__(self, engine: RolloutEngine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def submit(self, request: GenerationRequest) -> Future[list[GenerationOutput]]:
        """Start `engine.generate_one(request)`; the returned future must not be cancelled."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name="quartet-engine-calls", daemon=True
                )
                self._thread.start()
            return asyncio.run_coroutine_threadsafe(self.engine.generate_one(request), self._loop)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the loop thread (calls still running never deliver; wait for them first). Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = None
            self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)
        if not thread.is_alive():
            loop.close()


def wait_in_loop(future: Future[T]) -> asyncio.Future[T]:
    """A future of the running loop that takes `future`'s outcome; cancelling it leaves `future` alone.

    (`asyncio.wrap_future` would cancel `future` along with it.)
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def copy(done: Future[T]) -> None:
        if waiter.done():  # the caller gave up
            return
        if done.cancelled():
            waiter.cancel()
            return
        exc = done.exception()
        if exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_result(done.result())

    def on_done(done: Future[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits any more
            loop.call_soon_threadsafe(copy, done)

    future.add_done_callback(on_done)
    return waiter
