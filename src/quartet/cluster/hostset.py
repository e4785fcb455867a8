"""The run-scoped owner of a pool's host actors: strong handles, node facts, role groups, waits, shutdown.

The `HostSet` holds the strong actor handles. It is also registered in a module-level table until
`shutdown()`, so dropping every group object (or the HostSet itself) never lets Ray collect the actors of
a live run: Ray kills a non-detached actor when its last handle goes, and a handle fetched later by name
does not count.

The same class serves the local backend, whose "handles" run calls in this process and return `LocalRef`s.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quartet.cluster.dispatch import DataRank
from quartet.cluster.errors import WorkerError
from quartet.cluster.failures import failure_report
from quartet.cluster.group import RoleGroup
from quartet.cluster.host import LocalRef
from quartet.cluster.naming import RunNames
from quartet.cluster.watchdog import active_deadline, hang_error, silent_states

if TYPE_CHECKING:
    from quartet.cluster.pool import ResourcePool

__all__ = ["CALL_BOUND", "START_BOUND", "HostSet", "live_runs"]

log = logging.getLogger(__name__)
_LIVE: dict[str, HostSet] = {}
CALL_BOUND = "cluster.call_timeout_s"
START_BOUND = "cluster.start_timeout_s"
_POLL_S = 1.0  # how often a long wait looks for a failed rank while others still run
_SENTINELS: list[Callable[[], None]] = []


def add_sentinel(check: Callable[[], None]) -> None:
    """Run `check` at every poll of every wait on a pool (about each second) until `remove_sentinel`: it
    raises to end the wait. How a call in flight on another pool (a rollout generating ahead while the actor
    trains) that fails is reported at once, not when the driver next waits for it."""
    _SENTINELS.append(check)


_IN_SENTINEL = {"depth": 0}


def _run_sentinels() -> None:
    if _IN_SENTINEL["depth"]:  # a sentinel's own wait (naming its failure) runs no sentinels
        return
    _IN_SENTINEL["depth"] += 1
    try:
        for check in list(_SENTINELS):
            check()
    finally:
        _IN_SENTINEL["depth"] -= 1


def remove_sentinel(check: Callable[[], None]) -> None:
    """Stop running `check` (no error when it is not registered)."""
    if check in _SENTINELS:
        _SENTINELS.remove(check)


class HostSet:
    """The host actors of one pool (or the one local host): handles, nodes, role groups, waits."""

    def __init__(self, pool: ResourcePool | None, names: RunNames, label: str, call_timeout_s: float) -> None:
        self.pool = pool
        self.names = names
        self.label = label
        self.call_timeout_s = call_timeout_s
        self.timing: dict[str, float] = {}
        """Seconds of the start's phases (`connect`, `pool`, `hosts`, `role/<name>`): the startup record."""
        self.handles: list[Any] = []
        self.nodes: list[dict[str, Any]] = []
        self.groups: dict[str, RoleGroup[Any]] = {}
        self.layouts: dict[str, list[DataRank]] = {}
        self.specs: dict[str, Any] = {}
        """Each role's `RoleSpec` as it was started: what `quartet.cluster.replace` builds a new host with."""
        self.max_concurrency = 1
        """Calls each host runs at once (threads): a replacement host gets the same."""
        self.master: tuple[str, int] | None = None
        """The torch.distributed master (address, port) the hosts were given."""
        self.start_timeout_s = call_timeout_s
        """Bound on starting one host and building its roles (`cluster.start_timeout_s` on Ray)."""
        self.silent: set[int] = set()
        """Ranks that passed a deadline without answering (a `HangError` or the call timeout): the run's end
        does not wait on them again (`Workers.shutdown` skips the rollout engine's clean stop on them)."""

    @property
    def backend(self) -> str:
        """`ray`, or `local` for in-process roles without Ray."""
        return "local" if self.pool is None else "ray"

    def register(self) -> None:
        _LIVE[self.names.actor_prefix(self.label)] = self

    def layout(self, role: str) -> list[DataRank]:
        world = len(self.handles)
        return self.layouts.get(role, [DataRank(r, world, True) for r in range(world)])

    def node_of(self, rank: int) -> str:
        if rank < len(self.nodes):
            info = self.nodes[rank]
            return f"{info['ip']} (node {info['node_id'][:8]}, pid {info['pid']})"
        slot = self.pool.slots[rank] if self.pool and rank < len(self.pool.slots) else None
        return f"{slot.node_ip} (node {slot.node_id[:8]})" if slot else "unknown"

    def wait(
        self, role: str, method: str, refs: list[Any], timeout_s: float | None, bound: str = CALL_BOUND
    ) -> list[Any]:
        """Results of `refs` (one per rank) in rank order; any failure names role, rank and node.

        `bound` names what set `timeout_s` (a config key), for the error of a silent rank."""
        if all(isinstance(r, LocalRef) for r in refs):
            return [self._local_result(role, method, rank, ref) for rank, ref in enumerate(refs)]
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        return self._ray_wait(role, method, refs, timeout, bound)

    def _local_result(self, role: str, method: str, rank: int, ref: LocalRef) -> Any:
        if ref.error is not None:
            cause = ref.error
            raise WorkerError(
                role, rank, self.node_of(rank), f"{method}() raised {type(cause).__name__}: {cause}"
            ) from cause
        return ref.value

    def _ray_wait(self, role: str, method: str, refs: list[Any], timeout: float, bound: str) -> list[Any]:
        """Wait for all refs at once (one fetch when all succeed); a failed rank is reported as soon as
        it is seen, without waiting for the others, and a silent one when the timeout (or the open phase's
        deadline, `quartet.cluster.watchdog`, whichever comes first) passes."""
        import ray

        deadline = time.monotonic() + timeout
        watch = active_deadline()
        remaining = list(refs)
        while True:
            _run_sentinels()
            left = min(deadline, watch.deadline if watch else deadline) - time.monotonic()
            ready, remaining = ray.wait(
                remaining, num_returns=len(remaining), timeout=max(0.0, min(_POLL_S, left)), fetch_local=True
            )
            if not remaining:
                try:
                    return list(ray.get(refs, timeout=max(1.0, left)))
                except Exception:
                    self._raise_first_failure(role, method, refs)
                    raise
            if ready:  # some ranks finished while others run: a failure among them is reported now
                try:
                    ray.get(ready, timeout=max(1.0, left))
                except Exception:
                    self._raise_first_failure(role, method, refs)
                    raise
            if left <= 0:
                missing = [rank for rank, ref in enumerate(refs) if ref in remaining]
                self.silent.update(missing)
                if watch is not None and watch.deadline < deadline:
                    hang = hang_error(role, method, watch, missing, self.nodes)
                    log.error("%s", hang)  # named now: the run's own failure line comes after its cleanup
                    raise hang
                raise WorkerError(
                    role,
                    missing[0],
                    self.node_of(missing[0]),
                    f"{method}() gave no answer within {timeout:.0f} s ({bound}); "
                    f"ranks still running: {missing}{silent_states(missing, self.nodes)}",
                )

    def _raise_first_failure(self, role: str, method: str, refs: list[Any]) -> None:
        """Raise the WorkerError of the failed call: the lost node and its ranks first when a node died,
        else the rank whose actor died or raised (`quartet.cluster.failures`)."""
        error = failure_report(role, method, refs, self.node_of, self._node_id_of)
        if error is not None:
            raise error

    def _node_id_of(self, rank: int) -> str | None:
        if rank < len(self.nodes):
            return str(self.nodes[rank]["node_id"])
        slot = self.pool.slots[rank] if self.pool and rank < len(self.pool.slots) else None
        return slot.node_id if slot else None

    def health(self, timeout_s: float = 10.0) -> list[int]:
        """Ping every host; their pids in rank order, or a WorkerError naming the first silent one."""
        refs = [h.ping.remote() for h in self.handles]
        return self.wait(self.label, "ping", refs, timeout_s, f"the health check's {timeout_s:.0f} s")

    def shutdown(self) -> None:
        """Kill the host actors and release the placement groups (the local backend drops its roles)."""
        if self.pool is not None:
            import ray

            for handle in self.handles:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception as err:  # already dead: nothing to release
                    log.debug("kill %s: %s", handle, err)
            self.pool.remove()
        self.handles = []
        self.groups = {}
        _LIVE.pop(self.names.actor_prefix(self.label), None)


def live_runs() -> dict[str, HostSet]:
    """Host sets created in this process and not shut down, by actor-name prefix."""
    return dict(_LIVE)
