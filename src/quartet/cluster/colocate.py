"""Colocation: one host actor per bundle holding every role placed there, and the run-scoped owner.

    pool = ResourcePool.from_config(cfg.cluster)
    hosts = colocate(pool, RunNames("quartet", "demo-20261122"), actor=RoleSpec(Actor, cfg.actor),
                     critic=RoleSpec(Critic, cfg.critic))
    hosts.groups["critic"].compute_values(batch)
    hosts.shutdown()

The `HostSet` holds the strong actor handles. It is also registered in a module-level table until
`shutdown()`, so dropping every group object (or the HostSet itself) never lets Ray collect the actors of
a live run: Ray kills a non-detached actor when its last handle goes, and a handle fetched later by name
does not count.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from quartet.cluster.errors import DispatchError, WorkerError
from quartet.cluster.group import RoleGroup, driver_methods
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool

__all__ = ["HostSet", "RoleSpec", "colocate", "live_runs"]

log = logging.getLogger(__name__)
_LIVE: dict[str, HostSet] = {}


@dataclass(frozen=True)
class RoleSpec:
    """A role class and the arguments its constructor gets on every rank."""

    cls: type
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __init__(self, cls: type, *args: Any, **kwargs: Any) -> None:
        object.__setattr__(self, "cls", cls)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)


class HostSet:
    """The host actors of one pool: strong handles, node facts, role groups, waits and shutdown."""

    def __init__(self, pool: ResourcePool, names: RunNames, label: str, call_timeout_s: float) -> None:
        self.pool, self.names, self.label, self.call_timeout_s = pool, names, label, call_timeout_s
        self.handles: list[Any] = []
        self.nodes: list[dict[str, Any]] = []
        self.groups: dict[str, RoleGroup[Any]] = {}
        self._collecting: dict[str, list[bool]] = {}

    def collecting(self, role: str) -> list[bool]:
        return self._collecting.get(role, [True] * len(self.handles))

    def node_of(self, rank: int) -> str:
        if rank < len(self.nodes):
            info = self.nodes[rank]
            return f"{info['ip']} (node {info['node_id'][:8]}, pid {info['pid']})"
        slot = self.pool.slots[rank] if rank < len(self.pool.slots) else None
        return f"{slot.node_ip} (node {slot.node_id[:8]})" if slot else "unknown"

    def wait(self, role: str, method: str, refs: list[Any], timeout_s: float | None) -> list[Any]:
        """Results of `refs` (one per rank) in rank order; any failure names role, rank and node."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        outputs: list[Any] = []
        for rank, ref in enumerate(refs):
            try:
                outputs.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except GetTimeoutError:
                missing = [r for r, x in enumerate(refs) if not ray.wait([x], timeout=0)[0]]
                raise WorkerError(
                    role,
                    rank,
                    self.node_of(rank),
                    f"{method}() gave no answer within {timeout:.0f} s (cluster.call_timeout_s); "
                    f"ranks still running: {missing}",
                ) from None
            except RayActorError as err:
                raise WorkerError(
                    role, rank, self.node_of(rank), f"{method}(): the actor died: {err}"
                ) from err
            except RayTaskError as err:
                cause = err.cause if err.cause is not None else err
                raise WorkerError(
                    role, rank, self.node_of(rank), f"{method}() raised {type(cause).__name__}: {cause}"
                ) from err
        return outputs

    def health(self, timeout_s: float = 10.0) -> list[int]:
        """Ping every host; their pids in rank order, or a WorkerError naming the first silent one."""
        return self.wait(self.label, "ping", [h.ping.remote() for h in self.handles], timeout_s)

    def shutdown(self) -> None:
        """Kill the host actors and release the placement groups."""
        import ray

        for handle in self.handles:
            try:
                ray.kill(handle, no_restart=True)
            except Exception as err:  # already dead: nothing to release
                log.debug("kill %s: %s", handle, err)
        self.handles = []
        self.groups = {}
        self.pool.remove()
        _LIVE.pop(self.names.actor_prefix(self.label), None)


def live_runs() -> dict[str, HostSet]:
    """Host sets created in this process and not shut down, by actor-name prefix."""
    return dict(_LIVE)


def colocate(
    pool: ResourcePool,
    names: RunNames,
    label: str = "",
    call_timeout_s: float = 3600.0,
    start_timeout_s: float = 120.0,
    **roles: RoleSpec,
) -> HostSet:
    """Start ONE host actor per bundle of `pool`, construct every role in each, return the HostSet."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from quartet.cluster.host import RoleHost

    if not roles:
        raise DispatchError("colocate() needs at least one role, e.g. actor=RoleSpec(Actor, cfg.actor)")
    for role, spec in roles.items():
        driver_methods(role, spec.cls)  # declarations checked before anything starts
    label = label or "-".join(roles)
    hosts = HostSet(pool, names, label, call_timeout_s)
    remote_host = ray.remote(RoleHost)
    world = pool.world_size
    local_ranks: dict[str, int] = {}
    for slot in pool.slots:
        local_rank = local_ranks.get(slot.node_id, 0)
        local_ranks[slot.node_id] = local_rank + 1
        name = names.actor_name(label, slot.rank)
        handle = remote_host.options(
            name=name,
            namespace=names.namespace,
            num_cpus=pool.cpus_per_bundle,
            num_gpus=1 if pool.use_gpu else 0,
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=slot.placement_group, placement_group_bundle_index=slot.bundle_index
            ),
            runtime_env={"env_vars": {"OMP_NUM_THREADS": str(max(1, int(pool.cpus_per_bundle)))}},
        ).remote(slot.rank, world, local_rank, name)
        hosts.handles.append(handle)
    _LIVE[names.actor_prefix(label)] = hosts
    try:
        hosts.nodes = hosts.wait(
            label, "start", [h.node_info.remote() for h in hosts.handles], start_timeout_s
        )
        port = hosts.wait(label, "free_port", [hosts.handles[0].free_port.remote()], start_timeout_s)[0]
        hosts.wait(
            label,
            "set_master",
            [h.set_master.remote(hosts.nodes[0]["ip"], port) for h in hosts.handles],
            start_timeout_s,
        )
        for role, spec in roles.items():
            refs = [h.add_role.remote(role, spec.cls, spec.args, spec.kwargs) for h in hosts.handles]
            hosts._collecting[role] = hosts.wait(role, "__init__", refs, start_timeout_s)
            hosts.groups[role] = RoleGroup(role, spec.cls, hosts)
    except BaseException:
        hosts.shutdown()
        raise
    log.info("colocated %s on %d host(s) as %s", list(roles), world, names.actor_prefix(label))
    return hosts
