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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from quartet.weight_sync.buckets import DEFAULT_BUCKET_BYTES, TensorMeta, iter_buckets, unpack_bucket
from quartet.weight_sync.frames import PROTOCOL, SyncProgress, SyncStats, post_frame, recv_frame
from quartet.weight_sync.group import WeightSyncGroup

__all__ = ["ReceivedWeights", "SyncStats", "WeightReceiver", "WeightSender", "measure_plain_broadcast"]

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


class WeightSender:
    """Rank 0's side: streams named tensors to every receiver, one bucket per broadcast."""

    def __init__(self, group: WeightSyncGroup, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        if group.rank != 0:
            raise ValueError(
                f"the sender is rank 0 of a weight-sync group, this process is rank {group.rank}"
            )
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        self.group, self.bucket_bytes = group, bucket_bytes
        self.last_version: int | None = None
        """Version of the last completed sync; versions must increase so receivers can order them."""

    def send(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, timeout_s: float | None = None
    ) -> SyncStats:
        """Send every (name, tensor) of the stream as weights `version`; returns what was sent.

        The stream is read lazily (pass `model.named_parameters()` or a generator of gathered tensors, not
        a materialised copy). `timeout_s` (default: the group's) bounds the whole sync. Raises
        WeightSyncError when a receiver dies or hangs; an exception raised by the stream itself (or by
        packing one of its tensors) is re-raised as is, after the receivers were told to abort.
        """
        if self.last_version is not None and version <= self.last_version:
            raise ValueError(f"version {version} is not after the last one sent ({self.last_version})")
        progress = SyncProgress(self.group, version, timeout_s)
        begin = {"kind": "begin", "protocol": PROTOCOL, "version": version}
        pending = post_frame(progress, begin, None, "begin")
        pending_bytes = 0
        buckets = iter_buckets(named_tensors, self.bucket_bytes, self.group.device)
        while True:
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
            index = progress.buckets
            metas = [meta.to_wire() for meta in bucket.metas]
            header = {"kind": "bucket", "version": version, "index": index, "tensors": metas}
            pending = post_frame(progress, header, bucket.buffer, f"bucket {index}")
            pending_bytes = bucket.nbytes
            progress.buckets += 1
            progress.tensors += len(bucket.metas)
        totals = {"buckets": progress.buckets, "tensors": progress.tensors, "bytes": progress.bytes_done}
        progress.wait(post_frame(progress, {"kind": "end", "version": version, **totals}, None, "end"))
        self.last_version = version
        return progress.stats()


class WeightReceiver:
    """A receiver's side (rank >= 1): takes one sync at a time, bucket by bucket."""

    def __init__(self, group: WeightSyncGroup) -> None:
        if group.rank == 0:
            raise ValueError("rank 0 is the sender of its weight-sync group; receivers are ranks 1..N")
        self.group = group
        self.last_version: int | None = None
        """Version of the last sync fully received and loaded."""

    def receive(self, load: Callable[[NamedTensors], None], timeout_s: float | None = None) -> SyncStats:
        """Take the next sync, calling `load(tensors)` once per bucket as it arrives; returns what came.

        The tensors are views into the bucket's buffer (same dtype, shape and bytes as sent), e.g.
        `load=lambda ts: quartet.rollout.weights.load_named_tensors(model, ts)`. `timeout_s` (default: the
        group's) bounds the whole sync, counted from this call, so a receiver that starts waiting long before
        the sender sends needs a larger one. If `load` raises, the remaining buckets are still drained (the
        group stays in step) and WeightSyncError is raised at the end, from the loader's exception.
        """
        progress = SyncProgress(self.group, None, timeout_s)
        begin, _ = recv_frame(progress, "begin")
        if begin["kind"] != "begin" or begin.get("protocol") != PROTOCOL:
            problem = f"expected a protocol {PROTOCOL} begin frame, got {str(begin)[:200]}"
            raise progress.error("begin", problem, broken=True)
        progress.version = version = int(begin["version"])
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
            try:
                metas = [TensorMeta.from_wire(item) for item in header["tensors"]]
                tensors = unpack_bucket(metas, payload)
            except (KeyError, TypeError, ValueError) as exc:
                raise progress.error(stage, f"bad bucket metadata: {exc}", broken=True) from exc
            progress.bytes_done += payload.numel()
            progress.buckets += 1
            progress.tensors += len(metas)
            if load_error is None:
                try:
                    load(tensors)
                except Exception as exc:  # drained below, so the sender and other receivers are unaffected
                    load_error = (progress.buckets - 1, exc)
            del tensors, payload  # hold at most one bucket while waiting for the next
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

    def receive_all(self, timeout_s: float | None = None) -> ReceivedWeights:
        """Take the next sync and keep every tensor (the whole model in memory: for tests, small models)."""
        tensors: NamedTensors = []
        stats = self.receive(tensors.extend, timeout_s)
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
