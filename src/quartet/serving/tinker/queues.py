"""`FairQueues`: one worker thread serving several clients' FIFO queues in turn, each queue bounded.

The Tinker service runs every call on one base model on one thread (adapter switching is not
thread-safe), yet one client's long queue must not starve another: the thread takes one call from each
client's queue in turn (round robin), so a client that sent 100 calls delays another's next call by at
most one of them. Each client's calls still run in the order they were sent. A queue at its bound refuses
the next call with `QueueFull` (the service answers 429 with Retry-After; the SDK retries it itself).
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["FairQueues", "QueueFull"]

T = TypeVar("T")


class QueueFull(Exception):
    """A client's queue is at its bound; `retry_after_s` is a hint for when to try again."""

    def __init__(self, key: str, bound: int, retry_after_s: float) -> None:
        super().__init__(
            f"{bound} requests of {key} are already queued (tinker.max_queued_per_model): retry later"
        )
        self.retry_after_s = retry_after_s


class FairQueues:
    """Per-key bounded FIFOs served round robin by one daemon thread named `name`."""

    def __init__(self, name: str, max_queued_per_key: int = 64) -> None:
        if max_queued_per_key < 1:
            raise ValueError("max_queued_per_key must be >= 1")
        self.max_queued_per_key = max_queued_per_key
        self._queues: dict[
            str, collections.deque[tuple[Callable[[], Any], concurrent.futures.Future[Any]]]
        ] = {}
        self._turn: collections.deque[str] = collections.deque()  # keys with work, in serving order
        self._cond = threading.Condition()
        self._closed = False
        self._last_run_s = 0.1
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, key: str, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue `fn` behind `key`'s earlier calls; its future completes when it has run."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the service is shutting down")
            queue = self._queues.setdefault(key, collections.deque())
            if len(queue) >= self.max_queued_per_key:
                raise QueueFull(key, self.max_queued_per_key, retry_after_s=max(1.0, self._last_run_s))
            queue.append((fn, future))
            if key not in self._turn:
                self._turn.append(key)
            self._cond.notify()
        return future

    def queued(self, key: str) -> int:
        """How many of `key`'s calls wait (not counting one that runs)."""
        with self._cond:
            return len(self._queues.get(key, ()))

    def drop(self, key: str) -> int:
        """Cancel `key`'s queued calls (a call already running finishes); returns how many."""
        with self._cond:
            queue = self._queues.pop(key, collections.deque())
            if key in self._turn:
                self._turn.remove(key)
        for _, future in queue:
            future.cancel()
        return len(queue)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Cancel every queued call, let the running one finish (up to `timeout_s`), end the thread."""
        with self._cond:
            self._closed = True
            queues, self._queues = self._queues, {}
            self._turn.clear()
            self._cond.notify_all()
        for queue in queues.values():
            for _, future in queue:
                future.cancel()
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        import time

        while True:
            with self._cond:
                while not self._turn and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                key = self._turn.popleft()
                queue = self._queues[key]
                fn, future = queue.popleft()
                if queue:
                    self._turn.append(key)  # back of the line: the others go first
                else:
                    del self._queues[key]
            if not future.set_running_or_notify_cancel():
                continue
            start = time.monotonic()
            try:
                result = fn()
            except BaseException as err:  # the caller's future carries it; the thread goes on
                future.set_exception(err)
            else:
                future.set_result(result)
            self._last_run_s = time.monotonic() - start
