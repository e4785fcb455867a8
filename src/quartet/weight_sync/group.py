"""A standalone process group for weight sync: the sender is rank 0, receivers are ranks 1..N.

Why standalone: the trainer process already owns torch.distributed's default group (FSDP over the trainer
ranks), while weight sync spans other processes, often on other nodes (the rollout engines). Calling
`init_process_group` again would clash with that global state, and `new_group` can only pick ranks of the
default group. So this module builds its own `TCPStore` (hosted by the sender) and constructs the backend
object (`ProcessGroupGloo`, or `ProcessGroupNCCL` on GPUs) directly, then calls collectives on that object:
nothing is registered in, read from, or changed in torch.distributed's global registry.

Joining happens in two phases so that a driver can learn the port before anyone blocks: the sender calls
`listen(config)` (binds; with port 0 the OS picks one, read `GroupListener.port`), hands the port to the
receivers, which call `connect(config, rank)`, while the sender calls `GroupListener.accept()`. Every wait is
bounded by `GroupConfig.timeout_s` and fails with a `GroupJoinError` that names the address, the expected
world size, how many ranks joined and which are missing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Protocol, cast

import torch
import torch.distributed as dist

# torch.distributed re-exports these from here at runtime but does not declare them to type checkers
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore

from quartet.config.errors import require
from quartet.weight_sync.errors import BackendUnavailableError, GroupJoinError

__all__ = [
    "GroupConfig",
    "GroupListener",
    "SyncBackend",
    "WeightSyncGroup",
    "check_backend",
    "connect",
    "create_group",
    "listen",
]

_JOINED = "join/count"
_ALL_JOINED = "join/all"


class SyncBackend(StrEnum):
    """Collective library moving the bytes."""

    GLOO = "gloo"
    """CPU tensors over TCP; works everywhere (and is the one verified by the tests)."""

    NCCL = "nccl"
    """CUDA tensors over NVLink / InfiniBand; needs a CUDA build of torch and a visible GPU per rank."""


@dataclass(frozen=True)
class GroupConfig:
    """Where and how the sender and the receivers meet."""

    host: str
    """Address of the sender's machine: its store listens there and receivers connect to it."""

    port: int
    """TCP port of the sender's store; 0 lets the sender pick a free one (see `GroupListener.port`)."""

    world_size: int
    """Sender plus receivers: N receivers make a world of N + 1."""

    backend: SyncBackend = SyncBackend.GLOO
    """Collective library; gloo moves CPU tensors, nccl CUDA tensors."""

    timeout_s: float = 300.0
    """Bound in seconds on joining the group, and the default bound on one whole sync."""

    def __post_init__(self) -> None:
        require(bool(self.host), "host", "is empty", "give the sender's address, e.g. its node IP")
        require(0 <= self.port < 65536, "port", f"{self.port} is not a TCP port", "use 0..65535 (0 = any)")
        require(self.world_size >= 2, "world_size", f"{self.world_size} < 2", "one sender plus >= 1 receiver")
        require(self.timeout_s > 0, "timeout_s", f"{self.timeout_s} is not > 0")
        require(
            self.backend in tuple(SyncBackend),
            "backend",
            f"unknown backend {self.backend!r}",
            f"choose one of {[b.value for b in SyncBackend]}",
        )
        object.__setattr__(self, "backend", SyncBackend(self.backend))


def check_backend(backend: SyncBackend) -> torch.device:
    """The device this process's buffers live on for `backend`; raises where that backend cannot run."""
    if backend is SyncBackend.GLOO:
        return torch.device("cpu")
    if not dist.is_nccl_available() or not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"backend 'nccl' needs a CUDA build of torch with NCCL and a visible GPU; this torch "
            f"{torch.__version__} has NCCL={dist.is_nccl_available()}, CUDA={torch.cuda.is_available()}. "
            "Use backend='gloo' on CPU machines."
        )
    return torch.device("cuda", torch.cuda.current_device())


class _Collectives(Protocol):
    """What we use of a c10d backend object (its stubs do not declare the collectives it has)."""

    def broadcast(self, tensors: list[torch.Tensor], opts: dist.BroadcastOptions) -> dist.Work: ...

    def shutdown(self) -> None: ...


class WeightSyncGroup:
    """A joined weight-sync group: this process's rank, and broadcasts from rank 0 to everyone.

    A failed or timed-out collective leaves the underlying connections in an unknown state, so the
    transport marks the group broken (`broken` says why) and every later use raises; rebuild the group.
    """

    def __init__(
        self, config: GroupConfig, rank: int, store: Store, backend: _Collectives, device: torch.device
    ) -> None:
        self.config = config
        self.rank = rank
        self.device = device
        # kept alive until close: the sender's store object is the server the other ranks talk to, and
        # gloo's lazy-init mode (TORCH_GLOO_LAZY_INIT) connects through it on first use
        self._store: Store | None = store
        self._backend: _Collectives | None = backend
        self.broken: str | None = None

    @property
    def closed(self) -> bool:
        """Whether `close` was called (by this process; peers closing show up as broadcast errors)."""
        return self._backend is None

    @property
    def world_size(self) -> int:
        """Sender plus receivers."""
        return self.config.world_size

    def broadcast(self, tensor: torch.Tensor, timeout_s: float) -> dist.Work:
        """Start broadcasting `tensor` from rank 0 into the same-sized tensor of every other rank (async).

        The backend op itself is bounded by `timeout_s`, so a peer that hangs cannot pin a backend thread
        forever; wait on the returned work with `wait`.
        """
        if self._backend is None:
            raise RuntimeError("weight-sync group is closed")
        if self.broken is not None:
            raise RuntimeError(f"weight-sync group is broken ({self.broken}); rebuild it")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        opts.timeout = timedelta(seconds=max(timeout_s, 0.001))
        return self._backend.broadcast([tensor], opts)

    @staticmethod
    def wait(work: dist.Work, timeout_s: float) -> None:
        """Block until `work` finishes; raises when it fails or does not finish within `timeout_s`."""
        # timedelta(0) means "no timeout" to torch, so never pass it
        if not work.wait(timedelta(seconds=max(timeout_s, 0.001))):
            raise RuntimeError(f"operation did not finish within {timeout_s:.3g} s")

    def set_info(self, key: str, value: str) -> None:
        """Publish a small fact about this rank (e.g. the GPUs it sees) for the sender to read."""
        if self._store is None:
            raise RuntimeError("weight-sync group is closed")
        self._store.set(f"info/{key}/{self.rank}", value)

    def gather_info(self, key: str, timeout_s: float) -> list[str | None]:
        """The sender reads every receiver's `set_info(key)` (index 0 is rank 1), waiting at most
        `timeout_s` for them; None for a receiver that has not published it by then."""
        if self._store is None:
            raise RuntimeError("weight-sync group is closed")
        keys = [f"info/{key}/{rank}" for rank in range(1, self.world_size)]
        with contextlib.suppress(RuntimeError):  # a timeout: the missing ones read as None below
            self._store.wait(keys, timedelta(seconds=max(timeout_s, 0.001)))
        return [self._store.get(k).decode() if self._store.check([k]) else None for k in keys]

    def acknowledge(self, key: str) -> None:
        """A receiver marks `key` (e.g. one bucket of one version) done, through the sender's store.

        The collectives only go from rank 0 outwards; acknowledgements go back through the store, which
        every rank already reaches (the shared-buffer transport frees a bucket only once all ranks said so).
        """
        if self._store is None:
            raise RuntimeError("weight-sync group is closed")
        self._store.set(f"ack/{key}/{self.rank}", "1")

    def wait_acknowledged(self, key: str, timeout_s: float) -> list[int]:
        """The sender waits (at most `timeout_s`) until every receiver acknowledged `key`; returns the ranks
        that did not (empty when all did). The keys are removed once all came, so the store stays small."""
        if self._store is None:
            raise RuntimeError("weight-sync group is closed")
        keys = [f"ack/{key}/{rank}" for rank in range(1, self.world_size)]
        try:
            self._store.wait(keys, timedelta(seconds=max(timeout_s, 0.001)))
        except RuntimeError:  # a timeout (DistStoreError); which ranks are missing is counted below
            return [rank for rank, k in enumerate(keys, start=1) if not self._store.check([k])]
        for k in keys:
            self._store.delete_key(k)
        return []

    def close(self) -> None:
        """Shut the backend down and release the store; safe to call twice."""
        backend = self._backend
        self._backend = None
        self._store = None
        if backend is not None:
            # shutting down after a peer died may itself report the dead peer
            with contextlib.suppress(RuntimeError):
                backend.shutdown()

    def __enter__(self) -> WeightSyncGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_line(exc: BaseException) -> str:
    """c10d errors may append a C++ stack trace; the first line is the message."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _address(config: GroupConfig, port: int | None = None) -> str:
    return f"{config.host}:{config.port if port is None else port}"


def _join(config: GroupConfig, rank: int, store: Store, address: str) -> WeightSyncGroup:
    """Register `rank`, wait (bounded) until all ranks have, then build the backend on the shared store.

    The explicit count (rather than leaving the wait to the backend's own rendezvous) is what lets a
    timeout say how many ranks came and which are missing.
    """
    device = check_backend(config.backend)
    joined = -1
    try:
        rank_key = f"join/rank{rank}"
        if store.check([rank_key]):
            raise GroupJoinError(address, config.world_size, -1, f"rank {rank} joined twice")
        store.set(rank_key, "1")
        if store.add(_JOINED, 1) == config.world_size:  # the last one in opens the door for everyone
            store.set(_ALL_JOINED, "1")
        try:
            store.wait([_ALL_JOINED], timedelta(seconds=config.timeout_s))
        except RuntimeError as exc:  # a timeout; if the store itself is gone, counting fails below
            joined = store.add(_JOINED, 0)
            missing = [r for r in range(config.world_size) if not store.check([f"join/rank{r}"])]
            problem = f"rank {rank} gave up after {config.timeout_s:g} s; missing ranks {missing}"
            raise GroupJoinError(address, config.world_size, joined, problem) from exc
        backend = _make_backend(config, PrefixStore("backend", store), rank)
    except RuntimeError as exc:  # the store or a peer vanished mid-join (DistError is a RuntimeError)
        if isinstance(exc, GroupJoinError):
            raise
        problem = f"rank {rank} failed to join: {_first_line(exc)}"
        raise GroupJoinError(address, config.world_size, joined, problem) from exc
    return WeightSyncGroup(config, rank, store, backend, device)


def _make_backend(config: GroupConfig, store: Store, rank: int) -> _Collectives:
    timeout = timedelta(seconds=config.timeout_s)
    if config.backend is SyncBackend.GLOO:
        return cast(_Collectives, dist.ProcessGroupGloo(store, rank, config.world_size, timeout))
    # needs a GPU (untested here); kept so that nccl is a config switch, not a rewrite
    opts = dist.ProcessGroupNCCL.Options()  # pragma: no cover
    opts._timeout = timeout  # pragma: no cover
    nccl = dist.ProcessGroupNCCL(store, rank, config.world_size, opts)  # pragma: no cover
    return cast(_Collectives, nccl)  # pragma: no cover


class GroupListener:
    """The sender's half of a group being formed: the store listens (the port is known), peers may join."""

    def __init__(self, config: GroupConfig, store: TCPStore) -> None:
        self.config = config
        self._store = store

    @property
    def port(self) -> int:
        """The port the store listens on (the OS's pick when the config asked for port 0)."""
        return int(self._store.port)

    @property
    def address(self) -> str:
        """`host:port` receivers connect to."""
        return _address(self.config, self.port)

    def accept(self) -> WeightSyncGroup:
        """Join as rank 0 and wait for all receivers (at most `timeout_s`); raises GroupJoinError."""
        return _join(self.config, 0, self._store, self.address)


def _store(config: GroupConfig, is_master: bool) -> TCPStore:
    """The sender's store (`is_master`: hosted here) or a client of it; neither waits for the others."""
    return TCPStore(
        config.host,
        config.port,
        config.world_size,
        is_master=is_master,
        timeout=timedelta(seconds=config.timeout_s),
        wait_for_workers=False,
    )


def listen(config: GroupConfig) -> GroupListener:
    """Start the sender's store at `config.host:config.port` without waiting for anyone yet."""
    check_backend(config.backend)  # fail before anyone starts waiting on us
    try:
        store = _store(config, is_master=True)
    except (RuntimeError, OSError) as exc:
        problem = f"cannot listen: {_first_line(exc)}"
        raise GroupJoinError(_address(config), config.world_size, -1, problem) from exc
    return GroupListener(config, store)


def connect(config: GroupConfig, rank: int) -> WeightSyncGroup:
    """Join as receiver `rank` (1..world_size-1): reach the sender's store, then wait for every rank."""
    if not 1 <= rank < config.world_size:
        raise ValueError(f"a receiver's rank is 1..{config.world_size - 1}, got {rank}")
    check_backend(config.backend)
    address = _address(config)
    try:
        store = _store(config, is_master=False)
    except (RuntimeError, OSError) as exc:  # DistStoreError / DistNetworkError subclass RuntimeError
        problem = f"rank {rank} could not reach the sender's store within {config.timeout_s:g} s"
        problem += f" ({_first_line(exc)})"
        raise GroupJoinError(address, config.world_size, -1, problem) from exc
    return _join(config, rank, store, address)


def create_group(config: GroupConfig, rank: int) -> WeightSyncGroup:
    """Listen-and-accept for rank 0, connect for the others: the one-call form when the port is fixed."""
    return listen(config).accept() if rank == 0 else connect(config, rank)
