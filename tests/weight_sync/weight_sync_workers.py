"""Process bodies for the multi-process weight-sync tests (started with multiprocessing's spawn).

Every process reports through one queue as `(role, rank, kind, payload)` tuples; an exception is reported
as kind "error" with its traceback, so the test fails with the child's message instead of a timeout.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
import traceback
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from quartet.weight_sync import (
    GroupConfig,
    SyncTransport,
    WeightReceiver,
    WeightSender,
    WeightSyncError,
    connect,
    listen,
)

HOST = "127.0.0.1"
BUCKET_BYTES = 8192  # small: the weights below span ~10 buckets, one tensor is larger than a bucket
Report = tuple[str, int, str, Any]
Named = list[tuple[str, torch.Tensor]]


def make_weights(version: int) -> Named:
    """Deterministic weights for `version`, covering every dtype and layout case the transport must keep.

    Float values come from random bit patterns, so NaNs with assorted payloads, infinities and negative
    zeros are all in there; they must arrive bit for bit.
    """
    gen = torch.Generator().manual_seed(1000 + version)

    def bits(n: int, dtype: torch.dtype) -> torch.Tensor:
        wide = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[dtype]
        info = torch.iinfo(wide)
        return torch.randint(info.min, info.max, (n,), generator=gen, dtype=torch.int64).to(wide).view(dtype)

    weights = [
        ("embed.weight", bits(64 * 48, torch.bfloat16).reshape(64, 48)),
        ("norm.weight", bits(48, torch.float16)),
        ("q_proj.weight", bits(48 * 40, torch.float32).reshape(48, 40).t()),  # non-contiguous
        ("big.weight", bits(3000, torch.float32)),  # 12000 bytes > BUCKET_BYTES: travels alone
        ("step", torch.tensor(version * 7, dtype=torch.int64)),  # 0-d
        ("mask", torch.rand(33, generator=gen) > 0.5),
        ("empty", torch.zeros(0, 4)),
        ("ids", torch.randint(-(2**62), 2**62, (5, 3), generator=gen, dtype=torch.int64)),
    ]
    weights += [(f"layers.{i}.bias", bits(3, torch.float32)) for i in range(20)]  # many small ones
    weights.append(("lm_head.weight", weights[0][1]))  # tied to embed.weight: sent under both names
    return weights


def digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's bytes in row-major order (written independently of the package's packing)."""
    data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(data).hexdigest()


def describe(weights: Named) -> list[tuple[str, str, tuple[int, ...], str]]:
    """What a receiver must get, per tensor: name, dtype, shape and byte digest, in order."""
    return [(name, str(t.dtype), tuple(t.shape), digest(t)) for name, t in weights]


def _report_errors(queue: Queue[Report], role: str, rank: int) -> None:
    queue.put((role, rank, "error", traceback.format_exc()))


def run_sender(
    queue: Queue[Report],
    ports: Queue[int],
    world_size: int,
    versions: list[int],
    default_group_file: str,
    transport: str = "broadcast",
) -> None:
    """Rank 0: owns a default torch.distributed group (as an FSDP trainer would), then sends each version.

    The port (picked by the OS) goes once per receiver into `ports`, which the receivers wait on. With the
    `cuda_ipc` transport the weights are moved to the GPU first, as a trainer's would be.
    """
    try:
        # the trainer's own group, world of 1: weight sync must neither need it nor disturb it
        dist.init_process_group("gloo", init_method=Path(default_group_file).as_uri(), rank=0, world_size=1)
        listener = listen(GroupConfig(HOST, 0, world_size, timeout_s=30))
        for _ in range(world_size - 1):
            ports.put(listener.port)
        with listener.accept() as group:
            sender = WeightSender(group, BUCKET_BYTES, SyncTransport(transport))
            device = "cuda" if transport == SyncTransport.CUDA_IPC else "cpu"
            for version in versions:
                weights = [(name, t.to(device)) for name, t in make_weights(version)]
                stats = sender.send(iter(weights), version, timeout_s=30)
                queue.put(("sender", 0, "sent", stats))
        total = torch.ones(1)
        dist.all_reduce(total)  # the default group still works after the weight-sync group came and went
        queue.put(("sender", 0, "default_group", (dist.get_world_size(), float(total))))
        dist.destroy_process_group()
    except Exception:
        _report_errors(queue, "sender", 0)


def _keep(
    got: list[tuple[str, torch.Tensor]], sizes: list[int], tensors: list[tuple[str, torch.Tensor]]
) -> None:
    sizes.append(len(tensors))
    got.extend((name, t.clone()) for name, t in tensors)


def run_receiver(queue: Queue[Report], ports: Queue[int], rank: int, world_size: int, syncs: int) -> None:
    """Rank >= 1: receives `syncs` syncs, reporting what arrived as digests (tensors stay in this process)."""
    try:
        port = ports.get(timeout=60)
        with connect(GroupConfig(HOST, port, world_size, timeout_s=30), rank) as group:
            receiver = WeightReceiver(group)
            for _ in range(syncs):
                got: Named = []
                sizes: list[int] = []
                stats = receiver.receive(functools.partial(_keep, got, sizes), timeout_s=30)
                queue.put(("receiver", rank, "received", (stats, describe(got), sizes)))
    except Exception:
        _report_errors(queue, "receiver", rank)


def run_failing_sender(queue: Queue[Report], go: Event, version: int, timeout_s: float) -> None:
    """Rank 0 of 2: waits for `go` (its receiver has died by then), tries to send, reports the error."""
    try:
        listener = listen(GroupConfig(HOST, 0, 2, timeout_s=30))
        queue.put(("sender", 0, "port", listener.port))
        group = listener.accept()
        if not go.wait(60):
            raise TimeoutError("the test never said go")
        start = time.perf_counter()
        try:
            WeightSender(group, bucket_bytes=BUCKET_BYTES).send(
                iter(make_weights(version)), version, timeout_s
            )
        except WeightSyncError as exc:
            queue.put(("sender", 0, "failed", (str(exc), exc.version, time.perf_counter() - start)))
        else:
            queue.put(("sender", 0, "failed", ("no error raised", None, time.perf_counter() - start)))
        group.close()
    except Exception:
        _report_errors(queue, "sender", 0)


def run_dying_receiver(queue: Queue[Report], port: int) -> None:
    """Rank 1 of 2: joins, reports, then exits abruptly (no close, no cleanup), like a crashed engine."""
    try:
        connect(GroupConfig(HOST, port, 2, timeout_s=30), 1)
        queue.put(("receiver", 1, "joined", None))
    except Exception:
        _report_errors(queue, "receiver", 1)
    queue.close()
    queue.join_thread()  # flush the report: os._exit skips the queue's feeder thread
    os._exit(0)


def run_acking_sender(queue: Queue[Report], ports: Queue[int], world_size: int, timeout_s: float) -> None:
    """Rank 0 over shared memory, whose last receiver never acknowledges: reports the error and its time."""
    try:
        listener = listen(GroupConfig(HOST, 0, world_size, timeout_s=30))
        for _ in range(world_size - 1):
            ports.put(listener.port)
        with listener.accept() as group:
            start = time.perf_counter()
            sender = WeightSender(group, BUCKET_BYTES, SyncTransport.SHM)
            try:
                sender.send(iter(make_weights(5)), 5, timeout_s)
            except WeightSyncError as exc:
                queue.put(("sender", 0, "failed", (str(exc), exc.stage, time.perf_counter() - start)))
            else:
                queue.put(("sender", 0, "failed", ("no error raised", "", time.perf_counter() - start)))
    except Exception:
        _report_errors(queue, "sender", 0)


def run_stalled_receiver(
    queue: Queue[Report], ports: Queue[int], rank: int, world_size: int, go: Event
) -> None:
    """A receiver whose loader hangs on the first bucket (a stuck engine) until the test says `go`, so it
    does not acknowledge it in time; then it gives up on the sync (its own 8 s timeout) and exits cleanly."""
    try:
        port = ports.get(timeout=60)
        with connect(GroupConfig(HOST, port, world_size, timeout_s=30), rank) as group:
            queue.put(("receiver", rank, "joined", None))
            with contextlib.suppress(WeightSyncError):  # the sender gave up on it: the rest fails
                WeightReceiver(group).receive(lambda tensors: go.wait(60), timeout_s=8)
    except Exception:
        _report_errors(queue, "receiver", rank)
