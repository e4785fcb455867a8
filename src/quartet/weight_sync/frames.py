"""The wire protocol's frames, and the deadline and progress of one sync on one rank.

Every rank runs the same sequence of broadcasts from rank 0. A *frame* is

    prefix  int64[2] = (header_len, payload_len)   -- a receiver must size a tensor before data arrives
    header  uint8[header_len], UTF-8 JSON with a `kind` of begin, bucket, end or abort
    payload uint8[payload_len], omitted when payload_len == 0

`SyncProgress` bounds every wait by what is left of the sync's timeout and turns any backend failure into a
`WeightSyncError` naming the version, the stage and the bytes done, after marking the group broken (a failed
collective leaves its connections in an unknown state, so the group must not be used again).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from quartet.weight_sync.errors import WeightSyncError
from quartet.weight_sync.group import WeightSyncGroup

__all__ = ["FRAME_KINDS", "PROTOCOL", "Posted", "SyncProgress", "SyncStats", "post_frame", "recv_frame"]

PROTOCOL = 1
"""Wire format version, sent in the begin frame and checked by receivers."""

FRAME_KINDS = ("begin", "bucket", "end", "abort")

Posted = tuple[dist.Work, str, torch.Tensor]
"""A broadcast in flight: its work, its stage name, and its tensor (kept alive until the work is done)."""


@dataclass(frozen=True)
class SyncStats:
    """What one sync moved, as seen by this rank."""

    version: int
    """Weights version the sync carried."""

    bytes: int
    """Payload bytes broadcast: tensor bytes plus alignment gaps (headers not counted)."""

    buckets: int
    """Number of buckets (payload broadcasts)."""

    tensors: int
    """Number of named tensors."""

    seconds: float
    """Wall time of the whole sync on this rank, from the call to the closing frame."""

    @property
    def gb_per_s(self) -> float:
        """Payload throughput in GB/s (1e9 bytes), comparable with `measure_plain_broadcast`."""
        return self.bytes / max(self.seconds, 1e-9) / 1e9


class SyncProgress:
    """Deadline and counters of one sync on one rank; every transport step runs through it."""

    def __init__(self, group: WeightSyncGroup, version: int | None, timeout_s: float | None) -> None:
        self.group = group
        self.version = version
        self.timeout_s = group.config.timeout_s if timeout_s is None else timeout_s
        if self.timeout_s <= 0:
            raise ValueError(f"a sync's timeout_s must be > 0, got {self.timeout_s}")
        self.start = time.perf_counter()
        self.bytes_done = self.buckets = self.tensors = 0

    def remaining(self) -> float:
        """Seconds left of this sync's timeout."""
        return self.timeout_s - (time.perf_counter() - self.start)

    def error(self, stage: str, problem: str, *, broken: bool = False) -> WeightSyncError:
        """A WeightSyncError for this sync; `broken=True` also marks the group unusable."""
        if broken and self.group.broken is None:
            self.group.broken = f"a sync of version {self.version} failed at {stage}"
        return WeightSyncError(self.version, stage, self.bytes_done, problem)

    @contextmanager
    def stage(self, stage: str) -> Iterator[None]:
        """Run one transport step: refused past the deadline; any backend failure breaks the group."""
        if self.group.closed:
            raise self.error(stage, "this process closed the group")
        if self.group.broken is not None:
            raise self.error(stage, f"the group is broken ({self.group.broken}); rebuild it")
        if self.remaining() <= 0:
            raise self.error(stage, f"the sync's {self.timeout_s:g} s timeout has passed", broken=True)
        try:
            yield
        except RuntimeError as exc:  # gloo and nccl report errors and timeouts as RuntimeError
            elapsed = time.perf_counter() - self.start
            first_line = (str(exc).splitlines() or [type(exc).__name__])[0]  # c10d may add a C++ trace
            problem = (
                f"{first_line} ({elapsed:.1f} s into a {self.timeout_s:g} s timeout; a peer died or hung?)"
            )
            raise self.error(stage, problem, broken=True) from exc

    def post(self, tensor: torch.Tensor, stage: str) -> Posted:
        """Start a broadcast of `tensor` from rank 0 (bounded by the time left)."""
        with self.stage(stage):
            return self.group.broadcast(tensor, self.remaining()), stage, tensor

    def wait(self, posted: list[Posted]) -> None:
        """Wait for broadcasts in the order they were posted."""
        for work, stage, _ in posted:
            with self.stage(stage):
                self.group.wait(work, self.remaining())

    def stats(self) -> SyncStats:
        """The counters so far, with the wall time since the sync began."""
        seconds = time.perf_counter() - self.start
        version = -1 if self.version is None else self.version
        return SyncStats(version, self.bytes_done, self.buckets, self.tensors, seconds)


def post_frame(
    progress: SyncProgress, header: dict[str, Any], payload: torch.Tensor | None, stage: str
) -> list[Posted]:
    """Sender: start broadcasting one frame (prefix, header, payload); wait on the result with `wait`."""
    device = progress.group.device
    data = torch.frombuffer(bytearray(json.dumps(header, separators=(",", ":")).encode()), dtype=torch.uint8)
    data = data.to(device)
    size = 0 if payload is None else int(payload.numel())
    prefix = torch.tensor([data.numel(), size], dtype=torch.int64, device=device)
    posted = [progress.post(prefix, f"{stage} prefix"), progress.post(data, f"{stage} header")]
    if payload is not None and size:
        posted.append(progress.post(payload, f"{stage} payload"))
    return posted


def recv_frame(progress: SyncProgress, stage: str) -> tuple[dict[str, Any], torch.Tensor]:
    """Receiver: take one frame; returns its decoded header and its payload (empty when it had none)."""
    device = progress.group.device
    prefix = torch.zeros(2, dtype=torch.int64, device=device)
    progress.wait([progress.post(prefix, f"{stage} prefix")])
    header_len, payload_len = (int(v) for v in prefix.tolist())
    if header_len <= 0 or payload_len < 0:
        problem = f"garbled frame prefix ({header_len}, {payload_len}); protocol mismatch?"
        raise progress.error(stage, problem, broken=True)
    data = torch.empty(header_len, dtype=torch.uint8, device=device)
    progress.wait([progress.post(data, f"{stage} header")])
    payload = torch.empty(payload_len, dtype=torch.uint8, device=device)
    if payload_len:
        progress.wait([progress.post(payload, f"{stage} payload")])
    try:
        header = json.loads(bytes(data.cpu().numpy()).decode())
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise progress.error(stage, f"unreadable frame header: {exc}", broken=True) from exc
    if not isinstance(header, dict) or header.get("kind") not in FRAME_KINDS:
        raise progress.error(stage, f"unknown frame {str(header)[:200]}", broken=True)
    return header, payload
