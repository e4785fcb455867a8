"""The sync protocol on real gloo groups whose ranks are threads of this process (fast; the cross-process
cases are in test_transport_processes.py): stats, streaming, versions, aborts, loader errors, timeouts."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

import pytest
import torch
from weight_sync_workers import BUCKET_BYTES, HOST, describe, make_weights

from quartet.weight_sync import (
    GroupConfig,
    ReceivedWeights,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    WeightSyncGroup,
    connect,
    listen,
    measure_plain_broadcast,
)

pytestmark = pytest.mark.timeout(60)
GROUP_TIMEOUT_S = 20.0  # the groups' own timeout, the bound a sync would hit if its own were ignored
# A failure sooner than this came from the sync's own timeout (1-3 s in these tests): a busy machine adds
# seconds of scheduling to it, never this many. The test's claim, not a speed check.
WITHIN_S = GROUP_TIMEOUT_S / 2


@contextmanager
def groups(
    receivers: int = 1, timeout_s: float = GROUP_TIMEOUT_S
) -> Iterator[tuple[WeightSyncGroup, list[WeightSyncGroup]]]:
    """A sender group and its receivers' groups, all in this process (each rank joins from its own thread)."""
    listener = listen(GroupConfig(HOST, 0, receivers + 1, timeout_s=timeout_s))
    config = GroupConfig(HOST, listener.port, receivers + 1, timeout_s=timeout_s)
    with ThreadPoolExecutor(receivers) as pool:
        joining = [pool.submit(connect, config, rank) for rank in range(1, receivers + 1)]
        sender = listener.accept()
        others = [future.result(timeout=30) for future in joining]
    try:
        yield sender, others
    finally:
        for group in [sender, *others]:
            group.close()


@contextmanager
def receiving(group: WeightSyncGroup, timeout_s: float = 20) -> Iterator[Future[ReceivedWeights]]:
    """`receive_all` running in a thread while the body sends."""
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(WeightReceiver(group).receive_all, timeout_s)


def test_sync_delivers_every_tensor_bitwise_with_matching_stats() -> None:
    weights = make_weights(1)
    with groups(receivers=2) as (sender_group, receiver_groups), ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(WeightReceiver(g).receive_all, 20.0) for g in receiver_groups]
        sent = WeightSender(sender_group, BUCKET_BYTES).send(iter(weights), version=1)
        received = [future.result(timeout=30) for future in futures]
    total = sum(t.numel() * t.element_size() for _, t in weights)
    assert (sent.version, sent.tensors) == (1, len(weights))
    assert total <= sent.bytes < total + 64 * len(weights)  # payload plus alignment gaps only
    assert sent.buckets >= total // BUCKET_BYTES  # the small cap really splits the stream
    for got in received:
        assert got.version == 1
        assert describe(got.tensors) == describe(weights)
        assert (got.stats.bytes, got.stats.buckets, got.stats.tensors) == (
            sent.bytes,
            sent.buckets,
            sent.tensors,
        )


def test_loader_gets_one_bucket_at_a_time_in_order() -> None:
    weights = make_weights(2)
    calls: list[list[str]] = []
    with groups() as (sender_group, (receiver_group,)), ThreadPoolExecutor(1) as pool:
        receiver = WeightReceiver(receiver_group)
        future = pool.submit(receiver.receive, lambda ts: calls.append([name for name, _ in ts]))
        sent = WeightSender(sender_group, BUCKET_BYTES).send(iter(weights), version=2)
        stats = future.result(timeout=30)
    assert len(calls) == stats.buckets == sent.buckets
    assert [name for call in calls for name in call] == [name for name, _ in weights]
    sizes = {name: t.numel() * t.element_size() for name, t in weights}
    for call in calls:  # every bucket fits the cap, unless it is one tensor larger than the cap
        assert sum(sizes[n] for n in call) <= BUCKET_BYTES or (
            len(call) == 1 and sizes[call[0]] > BUCKET_BYTES
        )
    assert receiver.last_version == 2


def test_consecutive_syncs_carry_their_versions_and_versions_must_increase() -> None:
    with groups() as (sender_group, (receiver_group,)), ThreadPoolExecutor(1) as pool:
        sender, receiver = WeightSender(sender_group, BUCKET_BYTES), WeightReceiver(receiver_group)
        for version in (3, 4, 9):
            future = pool.submit(receiver.receive_all, 20.0)
            sender.send(iter(make_weights(version)), version)
            got = future.result(timeout=30)
            assert got.version == version
            assert describe(got.tensors) == describe(make_weights(version))
        with pytest.raises(ValueError, match="version 9 is not after the last one sent"):
            sender.send(iter(make_weights(9)), 9)  # refused before any frame: the group stays in step
        future = pool.submit(receiver.receive_all, 20.0)
        sender.send(iter(make_weights(10)), 10)
        assert future.result(timeout=30).version == 10


def _stream_that_fails() -> Iterator[tuple[str, torch.Tensor]]:
    yield from make_weights(5)[:4]
    raise KeyError("no such parameter: lm_head.weight")


@pytest.mark.parametrize(
    ("stream", "raised"),
    [
        (_stream_that_fails, KeyError),
        (lambda: iter([("a", torch.ones(4)), ("sparse", torch.eye(3).to_sparse())]), TypeError),
    ],
    ids=["iterator-raises", "sparse-tensor"],
)
def test_a_failing_stream_aborts_receivers_and_leaves_the_group_usable(
    stream: Callable[[], Iterator[tuple[str, torch.Tensor]]], raised: type[Exception]
) -> None:
    with groups() as (sender_group, (receiver_group,)):
        sender = WeightSender(sender_group, bucket_bytes=1024)
        with receiving(receiver_group) as future:
            with pytest.raises(raised):
                sender.send(stream(), version=5)
            with pytest.raises(WeightSyncError, match="version 5 .*the sender aborted") as aborted:
                future.result(timeout=30)
        assert aborted.value.version == 5
        assert sender_group.broken is None and receiver_group.broken is None
        with receiving(receiver_group) as future:
            sender.send(iter(make_weights(5)), version=5)  # the aborted version was never delivered
            assert describe(future.result(timeout=30).tensors) == describe(make_weights(5))


def test_a_failing_loader_drains_the_sync_then_raises() -> None:
    def load(tensors: list[tuple[str, torch.Tensor]]) -> None:
        raise RuntimeError("shape mismatch for embed.weight")

    with groups() as (sender_group, (receiver_group,)), ThreadPoolExecutor(1) as pool:
        sender, receiver = WeightSender(sender_group, BUCKET_BYTES), WeightReceiver(receiver_group)
        future = pool.submit(receiver.receive, load, 20.0)
        sent = sender.send(iter(make_weights(6)), version=6)  # the sender does not notice
        with pytest.raises(
            WeightSyncError, match="version 6 failed at loading bucket 0.*shape mismatch"
        ) as err:
            future.result(timeout=30)
        assert isinstance(err.value.__cause__, RuntimeError)
        assert err.value.bytes_done == sent.bytes and receiver.last_version is None
        future = pool.submit(receiver.receive_all, 20.0)
        sender.send(iter(make_weights(7)), version=7)
        assert future.result(timeout=30).version == 7


def test_a_hung_receiver_fails_the_sync_within_its_timeout_and_breaks_the_group() -> None:
    with groups() as (sender_group, _):  # the receiver joined but never calls receive
        sender = WeightSender(sender_group, BUCKET_BYTES)
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="version 8 failed at begin") as err:
            sender.send(iter(make_weights(8)), version=8, timeout_s=1.0)
        assert time.monotonic() - start < WITHIN_S
        assert err.value.version == 8 and err.value.stage.startswith("begin")
        assert sender_group.broken is not None
        with pytest.raises(WeightSyncError, match="broken"):
            sender.send(iter(make_weights(9)), version=9)


def test_a_receiver_without_a_sender_times_out_naming_no_version() -> None:
    with groups() as (_, (receiver_group,)):
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="unknown version .*begin") as err:
            WeightReceiver(receiver_group).receive_all(timeout_s=1.0)
        assert time.monotonic() - start < WITHIN_S and err.value.version is None


def test_measure_plain_broadcast_times_the_same_bytes_on_every_rank() -> None:
    with groups() as (sender_group, (receiver_group,)), ThreadPoolExecutor(1) as pool:
        future = pool.submit(measure_plain_broadcast, receiver_group, 1 << 20)
        seconds = measure_plain_broadcast(sender_group, 1 << 20)
        assert 0 < seconds < 20 and 0 < future.result(timeout=30) < 20
        with pytest.raises(ValueError, match="nbytes"):
            measure_plain_broadcast(sender_group, 0)


def test_roles_and_arguments_are_checked_before_the_wire() -> None:
    with groups() as (sender_group, (receiver_group,)):
        with pytest.raises(ValueError, match="sender is rank 0"):
            WeightSender(receiver_group)
        with pytest.raises(ValueError, match="receivers are ranks 1..N"):
            WeightReceiver(sender_group)
        with pytest.raises(ValueError, match="timeout_s must be > 0"):
            WeightSender(sender_group).send([("w", torch.ones(1))], version=1, timeout_s=0)
        assert sender_group.broken is None  # refused before anything went on the wire


def test_a_receiver_lost_mid_sync_fails_the_sender_naming_the_bucket_and_bytes_done() -> None:
    with groups() as (sender_group, (receiver_group,)), ThreadPoolExecutor(1) as pool:
        future = pool.submit(WeightReceiver(receiver_group).receive, lambda _: receiver_group.close(), 20.0)
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match="version 11 failed at bucket") as err:
            WeightSender(sender_group, BUCKET_BYTES).send(iter(make_weights(11)), version=11, timeout_s=3.0)
        assert time.monotonic() - start < WITHIN_S
        assert err.value.bytes_done > 0 and f"after {err.value.bytes_done} payload bytes" in str(err.value)
        with pytest.raises(WeightSyncError, match="version 11"):
            future.result(timeout=30)
