"""Routes token requests over several rollout replicas: least outstanding, sticky per conversation, bounded.

    scheduler = RequestScheduler([server_a, HttpReplicaClient(url_b)], max_outstanding_per_replica=32,
                                 queue_timeout_s=30.0)
    outs = await scheduler.generate_tokens(prompt_ids, sampling, conversation_id="episode-17")

A replica is anything with `async generate_tokens(prompt_ids, sampling) -> list[GenerationOutput]`: an
`OpenAIServer` in this process, or an `HttpReplicaClient` to a remote one. The scheduler has the same method
(plus `conversation_id`), so agent loops take either.

Policy:
- **Bounded slots.** A replica holds at most `max_outstanding_per_replica` requests. With none free, a request
  waits, first come first served, and fails with `NoFreeReplicaError` after `queue_timeout_s`. Arrivals
  do not overtake waiters: a freed slot is handed to the oldest waiter.
- **Sticky conversations.** The first turn of a `conversation_id` goes where placement puts it, and later
  turns go to the same replica, whose prefix cache still holds the conversation so far. When that replica
  is full, the turn goes to the least loaded replica with a free slot instead of waiting (a cache miss costs
  one prefill; waiting could cost a whole queue), and the conversation moves there, since that replica now
  holds its freshest prefix. Conversations are forgotten least recently used past `max_conversations`, or
  with `end_conversation`.
- **Least outstanding** among replicas with a free slot; ties go to the replica that has been sent fewest
  requests, so sequential traffic still spreads.
- **Per-request timeout.** A replica that has not answered in `request_timeout_s` is given up on
  (`ReplicaTimeoutError`); the call is cancelled (an `OpenAIServer` then aborts it in its engine).

One scheduler serves one event loop (its state is not locked); run it where the agent loops run.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from quartet.rollout.types import GenerationOutput, SamplingParams
from quartet.serving.errors import NoFreeReplicaError, ReplicaTimeoutError

__all__ = ["ReplicaClient", "RequestScheduler", "SchedulerStats"]


class ReplicaClient(Protocol):
    """One rollout replica, as the scheduler calls it."""

    async def generate_tokens(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        multi_modal: Mapping[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        """The `sampling.n` responses to a prompt of token ids (and its images: `quartet.serving.images`)."""
        ...


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of the scheduler's counters."""

    outstanding: tuple[int, ...]
    """Requests sent to each replica and not yet answered."""
    routed: tuple[int, ...]
    """Requests sent to each replica since the start."""
    routed_total: int
    """Requests sent to any replica."""
    sticky_hits: int
    """Later turns of a conversation sent to the replica of its previous turn."""
    sticky_moves: int
    """Later turns sent elsewhere because their replica was full."""
    waiting: int
    """Requests waiting for a free slot now."""
    queue_timeouts: int
    """Requests that found no free slot within `queue_timeout_s`."""
    request_timeouts: int
    """Requests a replica did not answer within `request_timeout_s`."""


class RequestScheduler:
    """Sends each request to one replica: least outstanding, sticky per conversation, bounded slots."""

    def __init__(
        self,
        replicas: Sequence[ReplicaClient],
        max_outstanding_per_replica: int,
        queue_timeout_s: float,
        request_timeout_s: float | None = None,
        max_conversations: int = 100_000,
    ) -> None:
        """request_timeout_s: longest wait for a replica's answer (None: the replica's own bound only)."""
        if not replicas:
            raise ValueError("the scheduler needs at least one replica")
        if max_outstanding_per_replica < 1:
            raise ValueError(f"max_outstanding_per_replica must be >= 1, got {max_outstanding_per_replica}")
        if queue_timeout_s < 0:
            raise ValueError(f"queue_timeout_s must be >= 0, got {queue_timeout_s}")
        if request_timeout_s is not None and request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {request_timeout_s}")
        self.replicas = list(replicas)
        self.max_outstanding = max_outstanding_per_replica
        self.queue_timeout_s = queue_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_conversations = max_conversations
        n = len(self.replicas)
        self._outstanding = [0] * n
        self._routed = [0] * n
        self._sticky_hits = 0
        self._sticky_moves = 0
        self._queue_timeouts = 0
        self._request_timeouts = 0
        self._home: OrderedDict[str, int] = OrderedDict()  # conversation id -> replica index
        self._waiters: deque[tuple[str | None, asyncio.Future[int]]] = deque()

    def stats(self) -> SchedulerStats:
        """The counters now."""
        return SchedulerStats(
            outstanding=tuple(self._outstanding),
            routed=tuple(self._routed),
            routed_total=sum(self._routed),
            sticky_hits=self._sticky_hits,
            sticky_moves=self._sticky_moves,
            waiting=sum(not f.done() for _, f in self._waiters),
            queue_timeouts=self._queue_timeouts,
            request_timeouts=self._request_timeouts,
        )

    def replica_of(self, conversation_id: str) -> int | None:
        """Index of the replica a conversation is pinned to, if any."""
        return self._home.get(conversation_id)

    def end_conversation(self, conversation_id: str) -> None:
        """Forget a finished conversation's replica."""
        self._home.pop(conversation_id, None)

    async def generate_tokens(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        conversation_id: str | None = None,
        multi_modal: Mapping[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        """The responses of the replica chosen for this request (see the module docstring for the policy);
        `multi_modal`: the prompt's images, passed on only when given."""
        index = await self._acquire(conversation_id)
        try:
            replica = self.replicas[index]
            call = (
                replica.generate_tokens(prompt_ids, sampling)
                if multi_modal is None
                else replica.generate_tokens(prompt_ids, sampling, multi_modal=multi_modal)
            )
            if self.request_timeout_s is None:
                return await call
            try:
                return await asyncio.wait_for(call, self.request_timeout_s)
            except TimeoutError:
                self._request_timeouts += 1
                raise ReplicaTimeoutError(
                    f"replica {index} did not answer within {self.request_timeout_s:g} s (request_timeout_s)"
                ) from None
        finally:
            self._release(index)

    # ---- slots --------------------------------------------------------------------------------------------

    def _choose(self, conversation_id: str | None) -> int | None:
        """The replica for a request now, taking its slot; None when every replica is full."""
        home = self._home.get(conversation_id) if conversation_id is not None else None
        free = [i for i, n in enumerate(self._outstanding) if n < self.max_outstanding]
        if not free:
            return None
        if home is not None and home in free:
            self._sticky_hits += 1
            index = home
        else:
            if home is not None:
                self._sticky_moves += 1
            index = min(free, key=lambda i: (self._outstanding[i], self._routed[i], i))
        if conversation_id is not None:
            self._home[conversation_id] = index
            self._home.move_to_end(conversation_id)
            while len(self._home) > self.max_conversations:
                self._home.popitem(last=False)
        self._outstanding[index] += 1
        self._routed[index] += 1
        return index

    async def _acquire(self, conversation_id: str | None) -> int:
        if not self._waiters:  # nobody queued: no one to overtake
            index = self._choose(conversation_id)
            if index is not None:
                return index
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (conversation_id, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, self.queue_timeout_s)
        except TimeoutError:
            self._queue_timeouts += 1
            raise NoFreeReplicaError(
                f"no free slot on any of {len(self.replicas)} replica(s) within {self.queue_timeout_s:g} s "
                f"(queue_timeout_s; each replica takes at most {self.max_outstanding} requests at once)"
            ) from None
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def _release(self, index: int) -> None:
        self._outstanding[index] -= 1
        while self._waiters:  # hand free slots to the oldest waiters still waiting
            conversation_id, future = self._waiters[0]
            if future.done():  # timed out or cancelled
                self._waiters.popleft()
                continue
            chosen = self._choose(conversation_id)
            if chosen is None:
                return
            self._waiters.popleft()
            future.set_result(chosen)
