"""Weight sync between real separate processes (spawned): 1 sender to 1 and to 2 receivers (bytes broadcast,
or handed out as shared-memory buffers, and over CUDA IPC on one GPU where there is one), a receiver that
dies before the sync, and one that never acknowledges a shared buffer. Receivers report sha256 digests of
what arrived; the test compares them with digests of the sender's weights rebuilt here from the same seeds."""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
from collections.abc import Iterator
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

import pytest
import torch
import weight_sync_workers as workers

from quartet.weight_sync import SyncStats

pytestmark = pytest.mark.timeout(120)
CTX = mp.get_context("spawn")
WAIT_S = 60  # generous: spawning a process that imports torch takes seconds on a busy 2-core machine


class Processes:
    """Processes started by one test, one report queue, and cleanup of whatever is still alive."""

    def __init__(self) -> None:
        self.queue: Any = CTX.Queue()
        self.started: list[SpawnProcess] = []

    def start(self, target: Any, *args: Any) -> None:
        process = CTX.Process(target=target, args=(self.queue, *args), daemon=True)
        process.start()
        self.started.append(process)

    def next(self, kind: str | None = None) -> tuple[str, int, str, Any]:
        """The next report, of `kind` if given (a child's traceback fails the test with its text)."""
        try:
            role, rank, got, payload = self.queue.get(timeout=WAIT_S)
        except queue_module.Empty:
            codes = [p.exitcode for p in self.started]
            pytest.fail(f"no report within {WAIT_S} s; child exit codes {codes}")
        if got == "error":
            pytest.fail(f"{role} rank {rank} raised:\n{payload}")
        assert kind in (None, got), f"expected a '{kind}' report, got '{got}' from {role} rank {rank}"
        return role, rank, got, payload

    def join(self) -> None:
        for process in self.started:
            process.join(timeout=WAIT_S)
            assert process.exitcode is not None, f"{process.name} did not exit within {WAIT_S} s"

    def stop(self) -> None:
        for process in self.started:  # only our own children, by handle
            if process.is_alive():
                process.kill()
                process.join(timeout=10)


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop()


GPU = pytest.param(
    1,
    "cuda_ipc",
    marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")],
)


@pytest.mark.parametrize(("receivers", "transport"), [(1, "broadcast"), (2, "broadcast"), (1, "shm"), GPU])
def test_syncs_arrive_bitwise_in_every_receiver(
    processes: Processes, receivers: int, transport: str, tmp_path: Path
) -> None:
    versions = [1, 2, 3]
    world = receivers + 1
    ports = CTX.Queue()  # all processes start together; receivers wait here for the sender's port
    default_group = str(tmp_path / "default_group")
    processes.start(workers.run_sender, ports, world, versions, default_group, transport)
    for rank in range(1, world):
        processes.start(workers.run_receiver, ports, rank, world, len(versions))

    sent: list[SyncStats] = []
    received: dict[int, list[Any]] = {rank: [] for rank in range(1, world)}
    default_group = None
    for _ in range(len(versions) * world + 1):  # reports of all ranks interleave
        _, rank, kind, payload = processes.next()
        if kind == "sent":
            sent.append(payload)
        elif kind == "received":
            received[rank].append(payload)
        else:
            assert kind == "default_group"
            default_group = payload
    processes.join()

    assert [s.version for s in sent] == versions
    assert default_group == (1, 1.0)  # the trainer's own group: untouched, still working
    for rank, syncs in received.items():
        assert len(syncs) == len(versions), f"rank {rank}"
        for version, sender_stats, (stats, tensors, bucket_sizes) in zip(versions, sent, syncs, strict=True):
            assert stats.version == version
            assert tensors == workers.describe(workers.make_weights(version)), f"rank {rank} v{version}"
            assert (stats.bytes, stats.buckets, stats.tensors) == (
                sender_stats.bytes,
                sender_stats.buckets,
                sender_stats.tensors,
            )
            assert stats.buckets > 3 and len(bucket_sizes) == stats.buckets  # several buckets, streamed
            assert sum(bucket_sizes) == stats.tensors == len(tensors)


def test_a_receiver_that_died_fails_the_sync_within_the_timeout(processes: Processes) -> None:
    go = CTX.Event()
    processes.start(workers.run_failing_sender, go, 7, 5.0)
    port = processes.next("port")[3]
    processes.start(workers.run_dying_receiver, port)
    processes.next("joined")
    receiver = processes.started[1]
    receiver.join(timeout=WAIT_S)
    assert receiver.exitcode == 0
    go.set()
    message, version, seconds = processes.next("failed")[3]
    processes.join()
    assert version == 7, message
    assert "version 7" in message and "failed at" in message
    # the sync's 5 s timeout fired, not the group's 30 s one (weight_sync_workers): a busy machine may add
    # seconds of scheduling to the 5, never 10
    assert seconds < 15


def test_a_receiver_that_never_acknowledges_fails_the_sender_naming_it(processes: Processes) -> None:
    ports = CTX.Queue()  # with two receivers, only the stalled one is named: test_shared_transport.py
    processes.start(workers.run_acking_sender, ports, 2, 5.0)
    go = CTX.Event()
    processes.start(workers.run_stalled_receiver, ports, 1, 2, go)  # its loader hangs on bucket 0
    processes.next("joined")
    message, stage, seconds = processes.next("failed")[3]
    go.set()  # unstick it, so both processes finish the broadcasts in flight and exit on their own
    processes.join()
    assert stage == "bucket 0 acknowledgement", message
    assert "receiver rank(s) [1] did not acknowledge bucket 0" in message
    assert "version 5" in message
    # the sync's 5 s timeout fired, not the group's 30 s one; scheduling may add seconds, never 10
    assert seconds < 15
