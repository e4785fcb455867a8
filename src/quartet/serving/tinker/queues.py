"""`FairQueues`: one worker thread serving several clients' FIFO queues in turn, each queue bounded.

The Tinker service runs every call on one base model on one thread (adapter switching is not
thread-safe), yet one client's long queue must not starve another: the thread takes one call from each
client's queue in turn (round robin), so a client that sent 100 calls delays another's next call by at
most one of them. Each client's calls still run in the order they were sent. A queue at its bound refuses
the next call with `QueueFull` (the service answers 429 with Retry-After; the SDK retries it itself).

Batching (`submit_batched`): a call may carry a `Batchable` (a tag, its payload, and `run_many`, which runs
many payloads at once). When the thread takes such a call it also takes, without waiting, the queued calls
of the same tag at the head of every key's queue (one per key per round, in round-robin order, rounds
repeated: so consecutive ones at a key's head join too) until `max_batch_rows` rows (`Batchable.rows`), and
runs `run_many` once over all their payloads. A call never joins past an earlier call of its own key, so
each key's order still holds. `batch_sizes()` tells how many calls the recent runs held.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

__all__ = ["Batchable", "FairQueues", "QueueFull"]

T = TypeVar("T")


class QueueFull(Exception):
    """A client's queue is at its bound; `retry_after_s` is a hint for when to try again."""

    def __init__(self, key: str, bound: int, retry_after_s: float) -> None:
        super().__init__(
            f"{bound} requests of {key} are already queued (tinker.max_queued_per_model): retry later"
        )
        self.retry_after_s = retry_after_s


@dataclasses.dataclass(frozen=True)
class Batchable:
    """A call that may run together with other queued calls of the same `tag`.

    run_many: payloads -> one result per payload, in order; a slot holding an exception fails only that
    call's future; `run_many` raising fails every call of the run. Calls of one tag share one `run_many`
    (the first taken call's is used). rows: this call's weight against `max_batch_rows`.
    """

    tag: Hashable
    payload: Any
    run_many: Callable[[Sequence[Any]], Sequence[Any]]
    rows: int = 1


_Call = tuple[Callable[[], Any] | None, Batchable | None, concurrent.futures.Future[Any]]


class FairQueues:
    """Per-key bounded FIFOs served round robin by one daemon thread named `name`."""

    def __init__(self, name: str, max_queued_per_key: int = 64, max_batch_rows: int = 256) -> None:
        if max_queued_per_key < 1 or max_batch_rows < 1:
            raise ValueError("max_queued_per_key and max_batch_rows must be >= 1")
        self.max_queued_per_key = max_queued_per_key
        self.max_batch_rows = max_batch_rows
        self._queues: dict[str, collections.deque[_Call]] = {}
        self._sizes: collections.deque[int] = collections.deque(maxlen=1000)
        self._turn: collections.deque[str] = collections.deque()  # keys with work, in serving order
        self._cond = threading.Condition()
        self._closed = False
        self._last_run_s = 0.1
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, key: str, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Queue `fn` behind `key`'s earlier calls; its future completes when it has run."""
        return self._put(key, (fn, None, concurrent.futures.Future()))

    def submit_batched(self, key: str, call: Batchable) -> concurrent.futures.Future[Any]:
        """Queue `call` behind `key`'s earlier calls; it may run in one `run_many` with other keys' calls
        of its tag (module doc). Its future completes with its own slot of the result."""
        return self._put(key, (None, call, concurrent.futures.Future()))

    def batch_sizes(self) -> list[int]:
        """How many calls each of the last (up to 1000) runs held, oldest first (1: a call alone)."""
        with self._cond:
            return list(self._sizes)

    def _put(self, key: str, item: _Call) -> concurrent.futures.Future[Any]:
        future = item[2]
        with self._cond:
            if self._closed:
                raise RuntimeError("the service is shutting down")
            queue = self._queues.setdefault(key, collections.deque())
            if len(queue) >= self.max_queued_per_key:
                raise QueueFull(key, self.max_queued_per_key, retry_after_s=max(1.0, self._last_run_s))
            queue.append(item)
            if key not in self._turn:
                self._turn.append(key)
            self._cond.notify()
        return future

    def queued(self, key: str) -> int:
        """How many of `key`'s calls wait (not counting one that runs)."""
        with self._cond:
            return len(self._queues.get(key, ()))

    def waiting(self) -> int:
        """How many calls wait over all keys (not counting one that runs)."""
        with self._cond:
            return sum(len(queue) for queue in self._queues.values())

    def drop(self, key: str) -> int:
        """Cancel `key`'s queued calls (a call already running finishes); returns how many."""
        with self._cond:
            queue = self._queues.pop(key, collections.deque())
            if key in self._turn:
                self._turn.remove(key)
        for _, _, future in queue:
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
            for _, _, future in queue:
                future.cancel()
        self._thread.join(timeout_s)

    def _take(self) -> list[_Call]:
        """Under the lock: the next call, and the calls that batch with it (module doc)."""
        key = self._turn.popleft()
        first = self._pop(key)
        if self._queues.get(key):
            self._turn.append(key)  # back of the line: the others go first
        if first[1] is None:
            return [first]
        taken = [first]
        rows = first[1].rows
        tag = first[1].tag
        order = list(self._turn)  # `key` (if it has more) is last: the other keys' heads join first
        while True:
            progress = False
            for other in order:
                queue = self._queues.get(other)
                head = queue[0][1] if queue else None
                if head is None or head.tag != tag or rows + head.rows > self.max_batch_rows:
                    continue
                taken.append(self._pop(other))
                rows += head.rows
                progress = True
                if other not in self._queues and other in self._turn:
                    self._turn.remove(other)
            if not progress:
                return taken

    def _pop(self, key: str) -> _Call:
        queue = self._queues[key]
        item = queue.popleft()
        if not queue:
            del self._queues[key]
        return item

    def _serve(self) -> None:
        import time

        while True:
            with self._cond:
                while not self._turn and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                taken = self._take()
                self._sizes.append(len(taken))
            live = [item for item in taken if item[2].set_running_or_notify_cancel()]
            if not live:
                continue
            start = time.monotonic()
            if live[0][1] is None:
                _run_one(live[0])
            else:
                _run_many(live)
            self._last_run_s = time.monotonic() - start


def _run_one(item: _Call) -> None:
    fn, _, future = item
    assert fn is not None
    try:
        result = fn()
    except BaseException as err:  # the caller's future carries it; the thread goes on
        future.set_exception(err)
    else:
        future.set_result(result)


def _run_many(items: list[_Call]) -> None:
    """One `run_many` over the items' payloads; each future gets its slot (or the run's exception)."""
    calls = [call for _, call, _ in items if call is not None]
    try:
        results = list(calls[0].run_many([call.payload for call in calls]))
        if len(results) != len(items):
            raise RuntimeError(f"run_many gave {len(results)} results for {len(items)} calls")
    except BaseException as err:  # every call of the run fails with it; the thread goes on
        for _, _, future in items:
            future.set_exception(err)
        return
    for (_, _, future), result in zip(items, results, strict=True):
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)
