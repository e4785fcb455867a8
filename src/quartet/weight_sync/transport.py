"""Streaming weights from one sender (rank 0) to N receivers over a `WeightSyncGroup`, bucket by bucket.

One sync is a `begin` frame {protocol, version}, one `bucket` frame per bucket {version, index, tensors:
[[name, dtype, shape, offset, nbytes], ...]} whose payload is the packed buffer, and an `end` frame
{version, buckets, tensors, bytes} whose totals let receivers check that nothing was lost (frames: see
`frames`). The bucket count is not known up front because the tensors come as a lazy stream (the sender
never materialises the model), hence the closing frame rather than a count in the header.

Failures: when the sender's own stream fails mid-sync (a bad tensor, an exception in the caller's iterator)
it sends an `abort` frame instead of `end`, so receivers fail at once and the group stays usable; when a
receiver's loader fails, it drains the rest of the sync before raising, for the same reason. When the
transport itself fails (a peer died or hung), every rank raises `WeightSyncError` within its timeout and the
group is marked broken: rebuild it.

Memory: the sender packs bucket i+1 while bucket i is on the wire, so it holds at most two buckets; the
receiver hands each bucket's tensors to a loader as it arrives and holds at most one.

Transports (`SyncTransport`, chosen by the sender per sync and named in the begin frame, so receivers
follow without configuration): `broadcast` sends each bucket's bytes as the frame's payload (gloo: through
the host); `cuda_ipc` and `shm` (same node only) pack each bucket into a buffer other processes can map
(`shared`: a CUDA IPC handle, or host shared memory) and send only its handle in the bucket frame. Each
receiver maps the buffer, loads from it, and acknowledges through the group's store; the sender frees a
buffer only once every receiver acknowledged it (still at most two alive), and a receiver that does not
acknowledge within the sync's timeout fails the sync naming its rank.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from quartet.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    Allocate,
    Bucket,
    TensorMeta,
    iter_buckets,
    unpack_bucket,
)
from quartet.weight_sync.frames import PROTOCOL, Posted, SyncProgress, SyncStats, post_frame, recv_frame
from quartet.weight_sync.group import WeightSyncGroup
from quartet.weight_sync.shared import (
    MappedBuffers,
    SharedBufferError,
    allocate_shared,
    export_buffer,
    gpu_uuid,
    visible_gpus,
)

__all__ = [
    "ReceivedWeights",
    "SyncStats",
    "SyncTransport",
    "WeightReceiver",
    "WeightSender",
    "measure_plain_broadcast",
]


class SyncTransport(StrEnum):
    """How a bucket's bytes reach the receivers (its metadata always travels in the group's frames)."""

    BROADCAST = "broadcast"
    """The bytes are the frame's payload, broadcast over the group (gloo: through host memory)."""

    CUDA_IPC = "cuda_ipc"
    """Same node, CUDA: receivers map the sender's device buffer through a CUDA IPC handle."""

    SHM = "shm"
    """Same node, CPU: receivers map the sender's buffer in host shared memory (the CPU twin of cuda_ipc)."""


NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class ReceivedWeights:
    """A whole sync collected in memory (`WeightReceiver.receive_all`): for tests and small models."""

    version: int
    """Weights version the sync carried."""

    tensors: NamedTensors
    """Every (name, tensor) in the sender's order."""

    stats: SyncStats
    """Counts and timing of the sync."""


def _shared_device(transport: SyncTransport) -> torch.device | None:
    """Where the sender packs shared buckets for `transport` (None: plain buffers on the group's device)."""
    if transport is SyncTransport.BROADCAST:
        return None
    if transport is SyncTransport.SHM:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("transport 'cuda_ipc' needs a visible CUDA device; use 'shm' or 'broadcast' on CPU")
    return torch.device("cuda", torch.cuda.current_device())


class _HeldBuffers:
    """The sender's shared bucket buffers: those receivers may still read (`held`, in bucket order) and
    those every receiver acknowledged (`free`), which later buckets of the sync reuse, because making a
    shared buffer costs far more than filling one (a new shared-memory segment; on the receivers, opening a
    new CUDA IPC handle). All are dropped with this object at the end of the sync."""

    KEEP_FREE = 2

    def __init__(self, progress: SyncProgress, bucket_bytes: int) -> None:
        self.progress = progress
        self.bucket_bytes = bucket_bytes
        self.held: deque[tuple[int, torch.Tensor]] = deque()
        self.free: list[torch.Tensor] = []
        self._bases: dict[int, torch.Tensor] = {}

    def allocator(self, device: torch.device | None) -> Allocate | None:
        """Makes bucket buffers on `device` from the free ones when one is large enough (None: broadcast)."""
        if device is None:
            return None

        def allocate(nbytes: int) -> torch.Tensor:
            fits = [i for i, b in enumerate(self.free) if b.device == device and b.numel() >= nbytes]
            if fits:
                base = self.free.pop(fits[0])
            else:  # too small ones are dropped first: never more than two buffers at a time
                self.free.clear()
                # a full-sized bucket gets room for any later one; a small model's only bucket does not
                capacity = max(nbytes, self.bucket_bytes) if 2 * nbytes >= self.bucket_bytes else nbytes
                base = allocate_shared(capacity, device)
            view = base[:nbytes]
            self._bases[id(view)] = base
            return view

        return allocate

    def release_until(self, keep: int) -> None:
        """Wait for the acknowledgements of the oldest buffers until at most `keep` are held."""
        progress = self.progress
        while len(self.held) > keep:
            index, _ = self.held[0]
            stage = f"bucket {index} acknowledgement"
            with progress.stage(stage):
                missing = progress.group.wait_acknowledged(
                    f"{progress.version}/{index}", progress.remaining()
                )
            if missing:
                problem = (
                    f"receiver rank(s) {missing} did not acknowledge bucket {index} within the sync's "
                    f"{progress.timeout_s:g} s timeout (hung in its loader, or dead?); the buffer was kept "
                    "until then"
                )
                raise progress.error(stage, problem, broken=True)
            _, buffer = self.held.popleft()
            self.free.append(self._bases.pop(id(buffer)))
            del self.free[: -self.KEEP_FREE]


class WeightSender:
    """Rank 0's side: streams named tensors to every receiver, one frame per bucket."""

    def __init__(
        self,
        group: WeightSyncGroup,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        transport: SyncTransport = SyncTransport.BROADCAST,
    ) -> None:
        if group.rank != 0:
            raise ValueError(
                f"the sender is rank 0 of a weight-sync group, this process is rank {group.rank}"
            )
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.transport = SyncTransport(transport)
        """How buckets travel (`SyncTransport`); may be changed between syncs."""
        self.last_version: int | None = None
        """Version of the last completed sync; versions must increase so receivers can order them."""
        self._receiver_gpus: list[list[str]] | None = None

    def receivers_without_gpu(self, device: torch.device, timeout_s: float | None = None) -> list[int]:
        """Receiver ranks that do not see the CUDA `device` (a CUDA IPC handle to it would not open there).

        Each receiver publishes the GPUs it sees when it is built; they are read once (waiting at most
        `timeout_s`, default the group's) and kept. A receiver that never published counts as not seeing it.
        """
        if self._receiver_gpus is None:
            wait = self.group.config.timeout_s if timeout_s is None else timeout_s
            published = self.group.gather_info("gpus", wait)
            self._receiver_gpus = [json.loads(p) if p is not None else [] for p in published]
        uuid = gpu_uuid(device)
        return [rank for rank, gpus in enumerate(self._receiver_gpus, start=1) if uuid not in gpus]

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, timeout_s: float | None = None
    ) -> SyncStats:
        """Send every (name, tensor) of the stream as weights `version`; returns what was sent.

        The stream is read lazily (pass `model.named_parameters()` or a generator of gathered tensors, not
        a materialised copy). `timeout_s` (default: the group's) bounds the whole sync. Raises
        WeightSyncError when a receiver dies or hangs (or, with a shared transport, does not acknowledge a
        bucket); an exception raised by the stream itself (or by packing one of its tensors) is re-raised
        as is, after the receivers were told to abort.
        """
        if self.last_version is not None and version <= self.last_version:
            raise ValueError(f"version {version} is not after the last one sent ({self.last_version})")
        transport, device = self.transport, _shared_device(self.transport)
        if device is not None and device.type == "cuda" and (blind := self.receivers_without_gpu(device)):
            raise ValueError(
                f"transport 'cuda_ipc': receiver rank(s) {blind} do not see this sender's GPU "
                f"{gpu_uuid(device)}, so its IPC handles cannot open there; use 'broadcast' for them"
            )
        progress = SyncProgress(self.group, version, timeout_s)
        held = _HeldBuffers(progress, self.bucket_bytes)
        begin = {"kind": "begin", "protocol": PROTOCOL, "version": version, "transport": transport.value}
        pending = post_frame(progress, begin, None, "begin")
        pending_bytes = 0
        buckets = iter_buckets(named_tensors, self.bucket_bytes, self.group.device, held.allocator(device))
        while True:
            held.release_until(1)  # shared: at most this buffer and the next one alive at a time
            try:
                bucket = next(buckets, None)  # packs the next bucket while `pending` is on the wire
            except Exception as exc:
                progress.wait(pending)
                progress.bytes_done += pending_bytes
                abort = {"kind": "abort", "version": version, "reason": f"{type(exc).__name__}: {exc}"}
                progress.wait(post_frame(progress, abort, None, "abort"))
                raise
            progress.wait(pending)
            progress.bytes_done += pending_bytes
            if bucket is None:
                break
            pending, pending_bytes = self._post_bucket(progress, bucket, held, transport), bucket.nbytes
        held.release_until(0)
        totals = {"buckets": progress.buckets, "tensors": progress.tensors, "bytes": progress.bytes_done}
        progress.wait(post_frame(progress, {"kind": "end", "version": version, **totals}, None, "end"))
        self.last_version = version
        return progress.stats()

    @staticmethod
    def _post_bucket(
        progress: SyncProgress, bucket: Bucket, held: _HeldBuffers, transport: SyncTransport
    ) -> list[Posted]:
        """Start sending one bucket: its bytes as the payload, or (shared) a handle to its buffer."""
        index = progress.buckets
        metas = [meta.to_wire() for meta in bucket.metas]
        header: dict[str, Any] = {
            "kind": "bucket",
            "version": progress.version,
            "index": index,
            "tensors": metas,
        }
        payload: torch.Tensor | None = bucket.buffer
        if transport is not SyncTransport.BROADCAST:
            header |= {"handle": export_buffer(bucket.buffer), "nbytes": bucket.nbytes}
            held.held.append((index, bucket.buffer))
            payload = None
        progress.buckets += 1
        progress.tensors += len(bucket.metas)
        return post_frame(progress, header, payload, f"bucket {index}")


class WeightReceiver:
    """A receiver's side (rank >= 1): takes one sync at a time, bucket by bucket."""

    def __init__(self, group: WeightSyncGroup) -> None:
        if group.rank == 0:
            raise ValueError("rank 0 is the sender of its weight-sync group; receivers are ranks 1..N")
        self.group = group
        self.last_version: int | None = None
        """Version of the last sync fully received and loaded."""
        group.set_info("gpus", json.dumps(visible_gpus()))  # the sender checks them before CUDA IPC

    def receive(self, load: Callable[[NamedTensors], None], timeout_s: float | None = None) -> SyncStats:
        """Take the next sync, calling `load(tensors)` once per bucket as it arrives; returns what came.

        The tensors are views into the bucket's buffer (same dtype, shape and bytes as sent), valid only
        during the call (with a shared transport they are the sender's memory): copy them, e.g.
        `load=lambda ts: quartet.rollout.weights.load_named_tensors(model, ts)`. `timeout_s` (default: the
        group's) bounds the whole sync, counted from this call, so a receiver that starts waiting long before
        the sender sends needs a larger one. If `load` raises, the remaining buckets are still drained (the
        group stays in step) and WeightSyncError is raised at the end, from the loader's exception.
        """
        progress = SyncProgress(self.group, None, timeout_s)
        begin, _ = recv_frame(progress, "begin")
        transports = [t.value for t in SyncTransport]
        if (
            begin["kind"] != "begin"
            or begin.get("protocol") != PROTOCOL
            or begin.get("transport") not in transports
        ):
            problem = f"expected a protocol {PROTOCOL} begin frame, got {str(begin)[:200]}"
            raise progress.error("begin", problem, broken=True)
        progress.version = version = int(begin["version"])
        mapped = None if begin["transport"] == SyncTransport.BROADCAST else MappedBuffers()
        load_error: tuple[int, Exception] | None = None
        while True:
            stage = f"bucket {progress.buckets} or end"
            header, payload = recv_frame(progress, stage)
            if header.get("version") != version:
                raise progress.error(
                    stage, f"a frame of version {header.get('version')} mid-sync", broken=True
                )
            if header["kind"] == "abort":
                raise progress.error(stage, f"the sender aborted the sync: {header.get('reason')}")
            if header["kind"] == "end":
                break
            if header["kind"] != "bucket" or header.get("index") != progress.buckets:
                problem = f"expected bucket {progress.buckets}, got {str(header)[:200]}"
                raise progress.error(stage, problem, broken=True)
            failed = self._take_bucket(progress, header, mapped or payload, load, load_error)
            load_error = load_error or failed
            del payload  # hold at most one bucket while waiting for the next
        got = (progress.buckets, progress.tensors, progress.bytes_done)
        sent = (header.get("buckets"), header.get("tensors"), header.get("bytes"))
        if got != sent:
            problem = f"received (buckets, tensors, bytes) = {got}, the sender sent {sent}"
            raise progress.error("end", problem, broken=True)
        if load_error is not None:
            index, cause = load_error
            problem = f"the loader raised {type(cause).__name__}: {cause}"
            raise progress.error(f"loading bucket {index}", problem) from cause
        self.last_version = version
        return progress.stats()

    def _take_bucket(
        self,
        progress: SyncProgress,
        header: dict[str, Any],
        source: torch.Tensor | MappedBuffers,
        load: Callable[[NamedTensors], None],
        load_error: tuple[int, Exception] | None,
    ) -> tuple[int, Exception] | None:
        """Unpack one bucket from its payload, or (shared) from the sender's buffer its handle names, and
        load it unless an earlier bucket's load failed; a shared bucket is then acknowledged, once its memory
        is no longer read here. Returns (index, error) when `load` raised."""
        index, stage = progress.buckets, f"bucket {progress.buckets}"
        try:
            payload = source.open(header["handle"]) if isinstance(source, MappedBuffers) else source
            if isinstance(source, MappedBuffers) and payload.numel() != header["nbytes"]:
                raise ValueError(f"the shared buffer has {payload.numel()} bytes, not {header['nbytes']}")
            metas = [TensorMeta.from_wire(item) for item in header["tensors"]]
            tensors = unpack_bucket(metas, payload)
        except SharedBufferError as exc:
            raise progress.error(stage, str(exc), broken=True) from exc
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise progress.error(stage, f"bad bucket metadata or handle: {exc}", broken=True) from exc
        progress.bytes_done += payload.numel()
        progress.buckets += 1
        progress.tensors += len(metas)
        failed = None
        if load_error is None:
            try:
                load(tensors)
            except (
                Exception
            ) as exc:  # drained by the caller, so the sender and other receivers are unaffected
                failed = (index, exc)
        if "handle" in header:
            if payload.is_cuda:  # the loader's copies must be done before the sender may reuse the memory
                torch.cuda.synchronize(payload.device)
            del tensors, payload
            with progress.stage(f"{stage} acknowledgement"):
                self.group.acknowledge(f"{progress.version}/{index}")
        return failed

    def receive_all(self, timeout_s: float | None = None) -> ReceivedWeights:
        """Take the next sync and keep a copy of every tensor (the whole model in memory: for tests, small
        models)."""
        tensors: NamedTensors = []

        def keep(bucket: NamedTensors) -> None:
            tensors.extend((name, tensor.clone()) for name, tensor in bucket)

        stats = self.receive(keep, timeout_s)
        return ReceivedWeights(stats.version, tensors, stats)


def measure_plain_broadcast(group: WeightSyncGroup, nbytes: int, timeout_s: float | None = None) -> float:
    """Seconds one plain broadcast of `nbytes` takes on this rank; every rank of the group must call it.

    The baseline for `SyncStats.gb_per_s`: the same bytes as one tensor, with no packing, headers or
    buckets, on the same group. A 1-byte broadcast first lines the ranks up, so the time is the transfer,
    not the wait for the slowest rank to arrive.
    """
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    progress = SyncProgress(group, None, timeout_s)
    progress.wait([progress.post(torch.zeros(1, dtype=torch.uint8, device=group.device), "line-up")])
    fill = torch.ones if group.rank == 0 else torch.empty
    data = fill(nbytes, dtype=torch.uint8, device=group.device)
    start = time.perf_counter()
    progress.wait([progress.post(data, "plain broadcast")])
    if group.device.type == "cuda":
        torch.cuda.synchronize(group.device)
    return time.perf_counter() - start
