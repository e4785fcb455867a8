"""The request scheduler's policy, on async fake replicas with a set delay (the scheduler is the unit)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from quartet.rollout import FinishReason, GenerationOutput, SamplingParams
from quartet.serving import NoFreeReplicaError, ReplicaTimeoutError, RequestScheduler

PARAMS = SamplingParams(max_new_tokens=4)


class FakeReplica:
    """Answers after `delay` seconds with one output whose only token is the replica's index."""

    def __init__(self, index: int, delay: float) -> None:
        self.index = index
        self.delay = delay
        self.active = 0
        self.peak = 0
        self.prompts: list[tuple[int, ...]] = []

    async def generate_tokens(
        self, prompt_ids: Sequence[int], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        self.prompts.append(tuple(prompt_ids))
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.active -= 1
        return [GenerationOutput("fake", 0, (self.index,), None, FinishReason.STOP)]


def served_by(outs: list[GenerationOutput]) -> int:
    return outs[0].token_ids[0]


def test_concurrent_requests_spread_evenly_within_the_bound() -> None:
    replicas = [FakeReplica(0, 0.05), FakeReplica(1, 0.05)]
    scheduler = RequestScheduler(replicas, max_outstanding_per_replica=2, queue_timeout_s=5.0)

    async def run() -> list[int]:
        outs = await asyncio.gather(*(scheduler.generate_tokens([i], PARAMS) for i in range(6)))
        return [served_by(o) for o in outs]

    where = asyncio.run(run())
    assert sorted(where) == [0, 0, 0, 1, 1, 1]
    assert [r.peak for r in replicas] == [2, 2]  # never past the bound
    stats = scheduler.stats()
    assert stats.routed == (3, 3) and stats.routed_total == 6
    assert stats.outstanding == (0, 0) and stats.waiting == 0


def test_least_outstanding_avoids_the_busy_replica() -> None:
    replicas = [FakeReplica(0, 0.5), FakeReplica(1, 0.01)]
    scheduler = RequestScheduler(replicas, max_outstanding_per_replica=4, queue_timeout_s=5.0)

    async def run() -> tuple[int, list[int]]:
        slow = asyncio.ensure_future(scheduler.generate_tokens([0], PARAMS))  # ties -> replica 0
        await asyncio.sleep(0.01)
        assert scheduler.stats().outstanding == (1, 0)
        quick = [served_by(await scheduler.generate_tokens([i], PARAMS)) for i in range(3)]
        return served_by(await slow), quick

    slow_at, quick_at = asyncio.run(run())
    assert slow_at == 0
    assert quick_at == [1, 1, 1]  # replica 0 holds one request, replica 1 none each time


def test_waiters_are_served_first_come_first_served() -> None:
    replica = FakeReplica(0, 0.05)
    scheduler = RequestScheduler([replica], max_outstanding_per_replica=1, queue_timeout_s=5.0)

    async def run() -> None:
        first = asyncio.ensure_future(scheduler.generate_tokens([0], PARAMS))
        await asyncio.sleep(0)
        later = [asyncio.ensure_future(scheduler.generate_tokens([i], PARAMS)) for i in (1, 2, 3)]
        await asyncio.sleep(0.01)
        assert scheduler.stats().waiting == 3 and scheduler.stats().outstanding == (1,)
        await asyncio.gather(first, *later)

    asyncio.run(run())
    assert replica.prompts == [(0,), (1,), (2,), (3,)]
    assert replica.peak == 1


def test_a_full_queue_times_out_with_a_clear_error() -> None:
    replica = FakeReplica(0, 0.5)
    scheduler = RequestScheduler([replica], max_outstanding_per_replica=1, queue_timeout_s=0.05)

    async def run() -> None:
        busy = asyncio.ensure_future(scheduler.generate_tokens([0], PARAMS))
        await asyncio.sleep(0)
        with pytest.raises(NoFreeReplicaError, match=r"no free slot on any of 1 replica\(s\) within 0.05 s"):
            await scheduler.generate_tokens([1], PARAMS)
        assert scheduler.stats().waiting == 0
        await busy

    asyncio.run(run())
    stats = scheduler.stats()
    assert stats.queue_timeouts == 1 and stats.routed_total == 1 and stats.outstanding == (0,)
    assert replica.prompts == [(0,)]  # the timed-out request never reached the replica


def test_conversations_stick_to_their_replica_over_a_less_loaded_one() -> None:
    replicas = [FakeReplica(0, 0.01), FakeReplica(1, 0.01)]
    scheduler = RequestScheduler(replicas, max_outstanding_per_replica=4, queue_timeout_s=5.0)

    async def run() -> int:
        await scheduler.generate_tokens([1], PARAMS, conversation_id="a")  # -> replica 0 (tie)
        replicas[0].delay = replicas[1].delay = 0.3
        held = [
            asyncio.ensure_future(scheduler.generate_tokens([2], PARAMS, conversation_id=c)) for c in "bcc"
        ]
        await asyncio.sleep(0.01)
        # b -> replica 1 (fewer sent), c -> replica 0 (least outstanding), c again -> replica 0 (sticky)
        assert scheduler.stats().outstanding == (2, 1)
        replicas[0].delay = 0.01
        second_turn = served_by(await scheduler.generate_tokens([1, 2], PARAMS, conversation_id="a"))
        await asyncio.gather(*held)
        return second_turn

    assert asyncio.run(run()) == 0  # the busier replica that holds the conversation's prefix
    stats = scheduler.stats()
    assert stats.sticky_hits == 2 and stats.sticky_moves == 0 and stats.routed == (4, 1)


def test_a_full_sticky_replica_moves_the_conversation() -> None:
    replicas = [FakeReplica(0, 0.2), FakeReplica(1, 0.2)]
    scheduler = RequestScheduler(replicas, max_outstanding_per_replica=2, queue_timeout_s=5.0)

    async def run() -> int:
        await scheduler.generate_tokens([1], PARAMS, conversation_id="a")  # -> replica 0
        held = [
            asyncio.ensure_future(scheduler.generate_tokens([2], PARAMS, conversation_id="a")) for _ in "xy"
        ]
        await asyncio.sleep(0.01)
        assert scheduler.stats().outstanding == (2, 0)  # both sticky: replica 0 is full
        moved = served_by(await scheduler.generate_tokens([3], PARAMS, conversation_id="a"))
        await asyncio.gather(*held)
        return moved

    assert asyncio.run(run()) == 1  # went to the free replica instead of waiting
    assert scheduler.replica_of("a") == 1  # and the conversation now lives there
    stats = scheduler.stats()
    assert stats.sticky_hits == 2 and stats.sticky_moves == 1 and stats.routed == (3, 1)
    scheduler.end_conversation("a")
    assert scheduler.replica_of("a") is None


def test_a_slow_replica_hits_the_request_timeout() -> None:
    scheduler = RequestScheduler([FakeReplica(0, 5.0)], 1, queue_timeout_s=1.0, request_timeout_s=0.05)
    with pytest.raises(ReplicaTimeoutError, match="replica 0 did not answer within 0.05 s"):
        asyncio.run(scheduler.generate_tokens([1], PARAMS))
    stats = scheduler.stats()
    assert stats.request_timeouts == 1 and stats.outstanding == (0,)


def test_forgets_least_recent_conversations_past_the_limit() -> None:
    scheduler = RequestScheduler([FakeReplica(0, 0.0)], 1, queue_timeout_s=1.0, max_conversations=2)

    async def run() -> None:
        for conversation in ("a", "b", "a", "c"):
            await scheduler.generate_tokens([1], PARAMS, conversation_id=conversation)

    asyncio.run(run())
    assert [scheduler.replica_of(c) for c in "abc"] == [0, None, 0]


def test_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        RequestScheduler([], 1, 1.0)
    with pytest.raises(ValueError, match="max_outstanding_per_replica"):
        RequestScheduler([FakeReplica(0, 0.0)], 0, 1.0)
