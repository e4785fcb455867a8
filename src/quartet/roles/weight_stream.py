"""The actor's weights to rollout replicas in other processes: the two ends of one weight-sync group.

    # driver (quartet.trainer.workers.weight_sync), once at start:
    address = actor.call(Actor.open_weight_stream, receivers, bucket_bytes, timeout_s)[0]   # rank 0 listens
    joins = rollout.submit(Rollout.join_weight_stream, *address, receivers + 1)           # replicas connect
    actor.call(Actor.accept_weight_stream); joins.get()
    # after every actor update:
    sent = actor.submit(Actor.publish_weights, version); got = rollout.submit(Rollout.receive_weights)

`WeightPublisher` (in the actor) streams `inference_weights(module)`: every trainer rank takes part in the
per-parameter FSDP gather, rank 0 packs size-bounded buckets and broadcasts them (`quartet.weight_sync`), so
no rank ever holds the whole model at once beyond the engine's own copy. `WeightSubscriber` (in a rollout
replica) receives a sync while the replica keeps generating: each bucket is copied into a staging area, and
the whole version is applied at once under the engine's step lock (never inside a forward pass), either
between two decode steps or once no generation is in flight (`rollout.weight_sync.apply`).
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator

import torch

from quartet.config.rollout import WeightApply, WeightTransport
from quartet.weight_sync import (
    GroupConfig,
    GroupListener,
    SyncTransport,
    WeightReceiver,
    WeightSender,
    connect,
    listen,
)

__all__ = ["GenerationLock", "WeightPublisher", "WeightSubscriber", "choose_transport", "node_address"]

log = logging.getLogger(__name__)

NamedTensors = list[tuple[str, torch.Tensor]]


def node_address() -> str:
    """This node's address as other nodes reach it (Ray's node IP where Ray runs, else loopback)."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return str(ray.util.get_node_ip_address())
    return "127.0.0.1"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


class GenerationLock:
    """A first-come-first-served lock: generations submitted ahead run in the order they arrived.

    `acquire(first=True)` queues ahead of every waiter (a stale group generated again must not wait for the
    batches queued behind it). `acquire(blocking=False)` succeeds only when nobody holds the lock and nobody
    waits for it, which is how `AFTER_DRAIN` tells that no generation is in flight or queued.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._held = False
        self._waiting: deque[object] = deque()

    def acquire(self, blocking: bool = True, first: bool = False) -> bool:
        with self._cond:
            if not blocking:
                if self._held or self._waiting:
                    return False
                self._held = True
                return True
            me = object()
            if first:
                self._waiting.appendleft(me)
            else:
                self._waiting.append(me)
            while self._held or self._waiting[0] is not me:
                self._cond.wait()
            self._waiting.popleft()
            self._held = True
            return True

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def __enter__(self) -> GenerationLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def choose_transport(
    setting: WeightTransport, same_node: bool, on_cuda: bool, gpu_shared: bool = True
) -> SyncTransport:
    """The transport of one sync: `setting` (`rollout.weight_sync.transport`) given whether every replica
    is on the actor's node, whether the weights being sent live on CUDA, and whether every replica sees the
    actor's GPU (Ray gives each worker its own CUDA_VISIBLE_DEVICES). An explicit same-node setting with a
    replica elsewhere is refused (a handle means nothing on another node)."""
    setting = WeightTransport(setting)
    if setting is WeightTransport.GLOO:
        return SyncTransport.BROADCAST
    if setting is WeightTransport.AUTO:
        ipc = same_node and on_cuda and gpu_shared
        return SyncTransport.CUDA_IPC if ipc else SyncTransport.BROADCAST
    if not same_node:
        raise ValueError(
            f"rollout.weight_sync.transport={setting.value} needs every rollout replica on the actor's node, "
            "but some are elsewhere; use transport=auto (or gloo)"
        )
    if setting is WeightTransport.CUDA_IPC and not torch.cuda.is_available():
        raise ValueError(
            "rollout.weight_sync.transport=cuda_ipc needs CUDA on the actor; use auto, gloo or shm on CPU"
        )
    return SyncTransport.CUDA_IPC if setting is WeightTransport.CUDA_IPC else SyncTransport.SHM


def _peek_device(
    named: Iterable[tuple[str, torch.Tensor]],
) -> tuple[torch.device, Iterator[tuple[str, torch.Tensor]]]:
    """The device of the stream's first tensor (cpu when empty), and the whole stream again."""
    stream = iter(named)
    first = next(stream, None)
    if first is None:
        return torch.device("cpu"), stream
    return first[1].device, itertools.chain([first], stream)


class WeightPublisher:
    """The trainer's end: rank 0 listens and sends; every rank gathers its shards when asked to publish."""

    def __init__(self) -> None:
        self.listener: GroupListener | None = None
        self.sender: WeightSender | None = None
        self.timeout_s = 300.0
        self.transport = WeightTransport.GLOO
        self.same_node = False

    def open(self, receivers: int, bucket_bytes: int, timeout_s: float) -> tuple[str, int] | None:
        """Rank 0 binds the group's store (a free port) and returns (address, port); other ranks None."""
        self.timeout_s = timeout_s
        self.bucket_bytes = bucket_bytes
        if _rank() != 0:
            return None
        config = GroupConfig(host=node_address(), port=0, world_size=receivers + 1, timeout_s=timeout_s)
        self.listener = listen(config)
        return config.host, self.listener.port

    def accept(self, transport: WeightTransport = WeightTransport.GLOO, same_node: bool = False) -> None:
        """Rank 0 waits (at most the timeout) until every receiver joined; `transport` is the configured
        setting, `same_node` whether every receiver is on this node (checked now for explicit settings)."""
        self.transport = WeightTransport(transport)
        self.same_node = same_node
        if self.listener is None:
            return
        choose_transport(self.transport, same_node, on_cuda=False)  # refuse a bad setting before any sync
        group = self.listener.accept()
        self.sender = WeightSender(group, self.bucket_bytes)

    def publish(self, named: Iterable[tuple[str, torch.Tensor]], version: int) -> dict[str, float]:
        """Send the stream as `version` (rank 0); other ranks only drain it (their part of the gather)."""
        if self.sender is None:
            if _rank() == 0:
                raise RuntimeError("publish before the weight stream was opened and accepted")
            for _ in named:  # the gather is a collective: every trainer rank walks the same parameters
                pass
            return {}
        device, stream = _peek_device(named)
        on_cuda = device.type == "cuda"
        auto_ipc = on_cuda and self.same_node and self.transport is WeightTransport.AUTO
        shared = auto_ipc and not self.sender.receivers_without_gpu(device)
        self.sender.transport = choose_transport(self.transport, self.same_node, on_cuda, shared)
        stats = self.sender.send(stream, version, self.timeout_s)
        return {
            "weight_sync/cuda_ipc": float(self.sender.transport is SyncTransport.CUDA_IPC),
            "weight_sync/shared": float(self.sender.transport is not SyncTransport.BROADCAST),
            "weight_sync/bytes": float(stats.bytes),
            "weight_sync/seconds": stats.seconds,
            "weight_sync/buckets": float(stats.buckets),
            "weight_sync/version": float(version),
        }

    def close(self) -> None:
        """Leave the group (its receivers' waits then fail at once); `open` may form a new one."""
        sender = self.sender
        self.sender = None
        self.listener = None
        if sender is not None:
            sender.group.close()


class WeightSubscriber:
    """A replica's end: receives each version into staging and applies it to the engine as configured.

    `load(tensors, version)` copies a whole version into the engine (taking its step lock once);
    `generation_lock` is held by the replica while a generation is in flight, so `AFTER_DRAIN` can tell
    whether the engine is idle now and, if not, leaves the version for `apply_pending` at the next start.
    """

    def __init__(
        self,
        load: Callable[[NamedTensors, int], int],
        generation_lock: GenerationLock,
        apply: WeightApply,
    ) -> None:
        self.load = load
        self.generation_lock = generation_lock
        self.apply = apply
        self.receiver: WeightReceiver | None = None
        self.timeout_s = 300.0
        self._pending: tuple[int, NamedTensors] | None = None
        self._pending_lock = threading.Lock()
        self.applied_version = 0

    def join(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Connect as receiver rank 1 + this replica's rank (blocks until the sender accepts)."""
        self.timeout_s = timeout_s
        config = GroupConfig(host=host, port=port, world_size=world_size, timeout_s=timeout_s)
        self.receiver = WeightReceiver(connect(config, 1 + _rank()))

    def receive(self, apply: WeightApply | None = None) -> dict[str, float]:
        """Take the next version, bucket by bucket into staging, then apply it (or queue it until idle);
        `apply` overrides the configured moment for this version."""
        if self.receiver is None:
            raise RuntimeError("receive before this replica joined the weight stream")
        staged: NamedTensors = []

        def stage(tensors: NamedTensors) -> None:  # views into the bucket buffer: copy before it is reused
            staged.extend((name, tensor.clone()) for name, tensor in tensors)

        stats = self.receiver.receive(stage, self.timeout_s)
        began = time.perf_counter()
        with self._pending_lock:
            self._pending = (stats.version, staged)
        when = self.apply if apply is None else WeightApply(apply)
        applied = self._apply_now() if when is WeightApply.BETWEEN_STEPS else self._apply_if_idle()
        return {
            "weight_sync/receive_seconds": stats.seconds,
            "weight_sync/apply_seconds": time.perf_counter() - began if applied else 0.0,
            "weight_sync/applied": float(applied),
        }

    def _apply_now(self) -> bool:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return False
        version, tensors = pending
        count = self.load(tensors, version)
        if count != len(tensors):
            raise RuntimeError(f"weights version {version}: the engine took {count} of {len(tensors)}")
        self.applied_version = version
        return True

    def _apply_if_idle(self) -> bool:
        if not self.generation_lock.acquire(blocking=False):
            return False  # a generation is in flight: `apply_pending` applies it before the next one
        try:
            return self._apply_now()
        finally:
            self.generation_lock.release()

    def apply_pending(self) -> bool:
        """Apply a version that arrived during the last generation (the caller holds the generation lock)."""
        return self._apply_now()

    def close(self) -> None:
        """Leave the group; `join` may join a new one (a version still pending stays pending)."""
        receiver, self.receiver = self.receiver, None
        if receiver is not None:
            receiver.group.close()
