"""The process behind one bundle: it holds one object per colocated role and runs calls on them.

`RoleHost` is a plain class; `colocate` turns it into a Ray actor, one per bundle, and the local backend
uses it in-process. Several roles in one host share the process (one CUDA context per GPU) and its memory,
which they take turns using.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quartet.cluster.host_memory import keep_freed_memory as keep_freed_memory_now
from quartet.cluster.watchdog import install_stack_dump

if TYPE_CHECKING:
    from quartet.cluster.dispatch import DataRank

__all__ = ["LocalRef", "RoleHost", "Sibling"]


@dataclass(frozen=True)
class Sibling:
    """A constructor argument that is another role object of the same host (same process).

        RoleSpec(Rollout, cfg, model_path, trainer=Sibling("actor"))

    The host passes its own `actor` object, so the rollout engine copies weights in-process. The sibling
    must be started earlier (roles start in the order they are given to `colocate`/`launch`).
    """

    role: str


@dataclass
class LocalRef:
    """The finished result of a call in the local backend: a value or the exception it raised."""

    value: Any = None
    error: BaseException | None = None

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _resolve(value: Any) -> Any:
    """Ray resolves only top-level ObjectRef arguments; chunks of a pending call arrive nested."""
    if isinstance(value, LocalRef):
        return value.result()
    ray = sys.modules.get("ray")  # no ObjectRef can exist in a process that never imported Ray
    if ray is not None and isinstance(value, ray.ObjectRef):
        return ray.get(value)
    return value


class RoleHost:
    """One rank of a colocated group: environment for torch.distributed, role objects, calls."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        local_rank: int,
        name: str,
        in_process: bool = False,
        threads: int = 0,
        keep_freed_memory: bool = False,
    ) -> None:
        """`threads` > 0: torch's CPU threads in this process (its bundle's CPUs), set before torch loads
        (OMP_NUM_THREADS) or at once where it has loaded. `keep_freed_memory`: a host process keeps what it
        frees for its next phase (`cluster.host_memory`; never the driver's own process)."""
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.name = name
        self.in_process = in_process  # the local backend: the driver's own process, never a Ray worker
        self.roles: dict[str, Any] = {}
        self.stacks_file = None if in_process else install_stack_dump(name)
        """Where this process writes every thread's stack on `HANG_SIGNAL` (`quartet.cluster.watchdog`)."""
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local_rank)})
        if not in_process:
            # A worker's stderr goes to the driver's console: no per-rank "Loading weights" progress bars.
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        self.keeps_freed_memory = keep_freed_memory and not in_process and keep_freed_memory_now()
        if threads > 0 and not in_process:
            os.environ["OMP_NUM_THREADS"] = str(threads)  # libgomp reads it when torch loads
            torch = sys.modules.get("torch")
            if torch is not None:  # a worker process Ray reused: torch is already up
                torch.set_num_threads(threads)

    def prewarm(self, modules: Sequence[str]) -> dict[str, Any]:
        """Import `modules` now (the role classes a run will add), while the driver still prepares: their
        imports are most of a role's construction on a fresh process. What fails here is left for
        `add_role` to raise and report; the answer says what was imported, in how many seconds."""
        began, began_unix = time.perf_counter(), time.time()
        failed: dict[str, str] = {}
        for module in modules:
            try:
                importlib.import_module(module)
            except Exception as err:  # add_role imports it again and reports the error with the role
                failed[module] = f"{type(err).__name__}: {err}"
        return {"began_unix": began_unix, "seconds": time.perf_counter() - began, "failed": failed}

    def node_info(self) -> dict[str, Any]:
        """pid, node id and IP of this process (for naming errors and checking placement)."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized() and not self.in_process:
            node_id, ip = ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()
        else:
            node_id, ip = "local", "127.0.0.1"
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "node_id": node_id,
            "ip": ip,
            "name": self.name,
            "stacks_file": self.stacks_file,
            "keeps_freed_memory": self.keeps_freed_memory,
        }

    def free_port(self) -> int:
        """A TCP port free on this node now (rank 0's node hosts the torch.distributed store)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", 0))
            return int(sock.getsockname()[1])

    def set_master(self, addr: str, port: int) -> None:
        """Environment read by `torch.distributed.init_process_group(init_method='env://')`."""
        os.environ.update({"MASTER_ADDR": addr, "MASTER_PORT": str(port)})

    def add_role(self, role: str, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DataRank:
        """Construct a role object in this process; return which data chunk it takes and if it collects."""
        from quartet.cluster.dispatch import DataRank  # torch's import: a host starts without it (`prewarm`)

        args = tuple(self._sibling(role, a) for a in args)
        kwargs = {k: self._sibling(role, v) for k, v in kwargs.items()}
        obj = cls(*args, **kwargs)
        self.roles[role] = obj
        data_rank = getattr(obj, "data_rank", None)
        if data_rank is None:
            return DataRank(self.rank, self.world_size, True)
        layout = data_rank()
        if not isinstance(layout, DataRank):
            raise TypeError(f"{cls.__qualname__}.data_rank() must return a DataRank, got {layout!r}")
        return layout

    def _sibling(self, role: str, value: Any) -> Any:
        if not isinstance(value, Sibling):
            return value
        if value.role not in self.roles:
            raise LookupError(
                f"role '{role}' needs the role '{value.role}' in the same host, but this host holds "
                f"{sorted(self.roles) or 'no roles yet'}; place both on one pool and start "
                f"'{value.role}' before '{role}'"
            )
        return self.roles[value.role]

    def call(self, role: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run `method` of the role object with (resolved) arguments."""
        fn = getattr(self.roles[role], method)
        return fn(*[_resolve(a) for a in args], **{k: _resolve(v) for k, v in kwargs.items()})

    def execute(
        self, role: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run `fn(role_object, *args, **kwargs)` in this process."""
        return fn(self.roles[role], *args, **kwargs)

    def ping(self) -> int:
        """Health check: answers with the pid."""
        return os.getpid()
