"""The shared-buffer transport (`SyncTransport.SHM`, the CPU twin of CUDA IPC) on gloo groups whose ranks are
threads of this process: versions in order and bitwise, the bucket layout, when the sender frees a buffer
(only after every receiver acknowledged it, at most two alive), and the handles themselves.
The cross-process cases (and CUDA IPC on a GPU) are in test_transport_processes.py."""

from __future__ import annotations

import base64
import json
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_transport import groups
from weight_sync_workers import BUCKET_BYTES, describe, make_weights

import quartet.weight_sync.transport as transport_module
from quartet.weight_sync import (
    SharedBufferError,
    SyncTransport,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    allocate_shared,
    export_buffer,
    open_buffer,
)
from quartet.weight_sync.buckets import ALIGN_BYTES
from quartet.weight_sync.shared import _decode, _encode

pytestmark = pytest.mark.timeout(60)
Named = list[tuple[str, torch.Tensor]]


def test_three_versions_arrive_in_order_bitwise_in_buckets_of_the_expected_layout() -> None:
    versions = [1, 2, 3]
    with groups(receivers=2) as (sender_group, receiver_groups), ThreadPoolExecutor(2) as pool:
        sender = WeightSender(sender_group, BUCKET_BYTES, SyncTransport.SHM)
        receivers = [WeightReceiver(g) for g in receiver_groups]
        for version in versions:
            buckets: list[list[Named]] = [[], []]

            def take(receiver: WeightReceiver, got: list[Named]) -> int:
                load = lambda ts: got.append([(n, t.clone()) for n, t in ts])  # noqa: E731
                return receiver.receive(load, 20.0).version

            futures = [pool.submit(take, r, got) for r, got in zip(receivers, buckets, strict=True)]
            sent = sender.send(iter(make_weights(version)), version)
            assert [f.result(timeout=30) for f in futures] == [version, version]
            weights = make_weights(version)
            for got in buckets:
                assert describe([t for bucket in got for t in bucket]) == describe(weights)
                assert len(got) == sent.buckets > 3
                sizes = {name: t.numel() * t.element_size() for name, t in weights}
                alone = [bucket for bucket in got if any(sizes[n] > BUCKET_BYTES for n, _ in bucket)]
                assert [[n for n, _ in b] for b in alone] == [["big.weight"]]  # too big: a bucket of its own
        assert [r.last_version for r in receivers] == [3, 3]


def test_the_sender_reuses_a_buffer_only_after_every_receiver_acknowledged_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alive: list[weakref.ref[torch.Tensor]] = []
    alive_at_allocation: list[int] = []

    def tracked(nbytes: int, device: torch.device) -> torch.Tensor:
        alive_at_allocation.append(sum(ref() is not None for ref in alive))
        buffer = allocate_shared(nbytes, device)
        alive.append(weakref.ref(buffer))
        return buffer

    monkeypatch.setattr(transport_module, "allocate_shared", tracked)
    slow: list[tuple[str, torch.Tensor]] = []

    def slow_loader(tensors: Named) -> None:  # receiver 2 copies each bucket late: a buffer reused before
        time.sleep(0.1)  # its acknowledgement would already hold the next bucket's bytes by then
        slow.extend((name, tensor.clone()) for name, tensor in tensors)

    with groups(receivers=2) as (sender_group, receiver_groups), ThreadPoolExecutor(2) as pool:
        sender = WeightSender(sender_group, BUCKET_BYTES, SyncTransport.SHM)
        for version in (4, 5):
            fast = pool.submit(WeightReceiver(receiver_groups[0]).receive_all, 20.0)
            slowly = pool.submit(WeightReceiver(receiver_groups[1]).receive, slow_loader, 20.0)
            sent = sender.send(iter(make_weights(version)), version)
            assert describe(fast.result(timeout=30).tensors) == describe(make_weights(version))
            assert slowly.result(timeout=30).buckets == sent.buckets
            assert describe(slow) == describe(make_weights(version))
            slow.clear()
    assert max(alive_at_allocation) <= 1  # at most two buffers at a time
    # buffers are reused across a sync's buckets: fewer made than buckets sent (the big tensor's own
    # bucket needs one of its size)
    assert len(alive) < 2 * sent.buckets
    assert all(ref() is None for ref in alive)  # every one freed once the syncs are over


def test_only_the_receiver_that_does_not_acknowledge_is_named_within_the_sync_timeout() -> None:
    stuck = threading.Event()
    with groups(receivers=2) as (sender_group, receiver_groups), ThreadPoolExecutor(2) as pool:
        pool.submit(WeightReceiver(receiver_groups[0]).receive_all, 4.0)  # acknowledges every bucket
        stalled = WeightReceiver(receiver_groups[1])
        pool.submit(stalled.receive, lambda tensors: stuck.wait(10), 4.0)  # hangs in its loader
        start = time.perf_counter()
        with pytest.raises(WeightSyncError, match=r"receiver rank\(s\) \[2\] did not acknowledge bucket 0"):
            WeightSender(sender_group, BUCKET_BYTES, SyncTransport.SHM).send(iter(make_weights(6)), 6, 1.5)
        seconds = time.perf_counter() - start
        stuck.set()  # let the loader return; both receivers then hit their own 4 s timeout
        assert sender_group.broken is not None  # a receiver in an unknown state: rebuild the group
    assert seconds < 10  # the sync's 1.5 s, not the group's 20 s (scheduling adds seconds, never 8)


def test_a_buffer_round_trips_through_its_handle_as_json() -> None:
    buffer = allocate_shared(1000, torch.device("cpu"))
    buffer.copy_(torch.arange(1000) % 251)
    handle = export_buffer(buffer)
    mapped = open_buffer(handle)
    assert torch.equal(mapped, buffer)
    mapped[7] = 99  # the same memory, not a copy
    assert int(buffer[7]) == 99
    assert handle["kind"] == "shm" and isinstance(handle["name"], str)  # JSON-ready: no pickled objects


def test_bad_handles_and_buffers_are_refused_with_the_reason() -> None:
    handle = export_buffer(allocate_shared(ALIGN_BYTES, torch.device("cpu")))
    missing = handle | {"name": base64.b64encode(b"/no-such-quartet-segment").decode()}
    with pytest.raises(SharedBufferError, match="cannot map"):
        open_buffer(missing)
    with pytest.raises(SharedBufferError, match="unknown shared-buffer handle kind"):
        open_buffer({"kind": "pickle"})
    with pytest.raises(ValueError, match="not in shared memory"):
        export_buffer(torch.zeros(8, dtype=torch.uint8))
    if not torch.cuda.is_available():
        with pytest.raises(SharedBufferError, match="no CUDA device"):
            open_buffer({"kind": "cuda", "uuid": "GPU-0", "args": []})
        with pytest.raises(ValueError, match="needs a visible CUDA device"):
            transport_module._shared_device(SyncTransport.CUDA_IPC)


def test_cuda_ipc_handle_arguments_survive_json_without_pickle() -> None:
    args = (torch.Tensor, torch.Size([4, 2]), (2, 1), 0, torch.storage.TypedStorage, torch.bfloat16, 0)
    args += (b"\x00\xffhandle", 64, 0, False, b"/ref", 3, b"event", True)
    wire = json.loads(json.dumps([_encode(arg) for arg in args]))
    assert tuple(_decode(item) for item in wire) == args
    with pytest.raises(TypeError, match="names the type"):
        _encode(torch.nn.Parameter)
    with pytest.raises(SharedBufferError, match="unknown type"):
        _decode({"type": "os.system"})


def test_cuda_ipc_is_refused_up_front_for_receivers_that_do_not_see_the_senders_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # each Ray worker sees only its own GPUs: receiver 2 here sees another GPU than the sender's "GPU-a"
    monkeypatch.setattr(transport_module, "gpu_uuid", lambda device: "GPU-a")
    monkeypatch.setattr(transport_module, "_shared_device", lambda transport: torch.device("cuda", 0))
    with groups(receivers=2) as (sender_group, receiver_groups):
        monkeypatch.setattr(transport_module, "visible_gpus", lambda: ["GPU-b", "GPU-a"])
        WeightReceiver(receiver_groups[0])
        monkeypatch.setattr(transport_module, "visible_gpus", lambda: ["GPU-b"])
        WeightReceiver(receiver_groups[1])
        sender = WeightSender(sender_group, BUCKET_BYTES, SyncTransport.CUDA_IPC)
        assert sender.receivers_without_gpu(torch.device("cuda", 0)) == [2]
        with pytest.raises(ValueError, match=r"receiver rank\(s\) \[2\] do not see this sender's GPU GPU-a"):
            sender.send(iter(make_weights(1)), 1)
        assert sender_group.broken is None  # refused before the first frame: the group stays usable


def test_a_receiver_that_never_published_its_gpus_reads_as_seeing_none() -> None:
    with groups(receivers=2) as (sender_group, receiver_groups):
        WeightReceiver(receiver_groups[0])  # rank 1 publishes (no CUDA here: an empty list); rank 2 does not
        assert sender_group.gather_info("gpus", 0.5) == ["[]", None]
