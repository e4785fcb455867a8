"""A new host process for one rank whose process died, on the same placement-group bundle.

    replace_host(hosts, rank)      # hosts.handles[rank] is now a fresh host with the same roles

The rank keeps its bundle (so its devices and node), its actor name (Ray frees the name of a dead actor;
tools find a run's actors by name), its torch.distributed master and its roles, each built from the
`RoleSpec` it was started with. What the roles held in memory (weights loaded since, caches) is gone: the
caller brings the new one up to date (`quartet.trainer.recovery` gives a rollout replica the
current weights). Every wait is bounded by the pool's start timeout.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from quartet.cluster.dispatch import check_layout
from quartet.cluster.errors import WorkerError
from quartet.cluster.host_actors import host_options, host_threads
from quartet.cluster.hostset import START_BOUND, HostSet

__all__ = ["replace_host"]

log = logging.getLogger(__name__)

_NAME_POLL_S = 0.2
"""How often a new host retries a name that Ray has not yet released from the dead one."""


def replace_host(hosts: HostSet, rank: int) -> dict[str, Any]:
    """Start a new host for `rank` on its bundle and build its roles like the original; its node facts.

    Raises WorkerError (naming the rank) when the new host cannot start or build a role in time; the old
    handle is dropped either way (it is dead)."""
    import ray

    if hosts.pool is None or not 0 <= rank < len(hosts.handles):
        raise ValueError(f"replace_host needs a Ray host set and a rank in it, got rank {rank}")
    with contextlib.suppress(Exception):  # already dead: only make sure it never comes back
        ray.kill(hosts.handles[rank], no_restart=True)
    deadline = time.monotonic() + hosts.start_timeout_s
    handle = _start_host(hosts, rank, deadline)
    hosts.handles[rank] = handle
    hosts.silent.discard(rank)  # a fresh host: nothing it did was silent
    try:
        info = _build_roles(hosts, rank, handle, deadline)
    except BaseException:
        with contextlib.suppress(Exception):  # half-built: no use to anyone, and it holds the bundle
            ray.kill(handle, no_restart=True)
        raise
    log.info("%s rank %d: a new host (pid %s) replaced the dead one", hosts.label, rank, info.get("pid"))
    return info


def _build_roles(hosts: HostSet, rank: int, handle: Any, deadline: float) -> dict[str, Any]:
    """Node facts, the torch.distributed master and every role of the pool on the new host, in order."""
    label, left = hosts.label, max(1.0, deadline - time.monotonic())
    info: dict[str, Any] = hosts.wait(label, "start", [handle.node_info.remote()], left, START_BOUND)[0]
    if rank < len(hosts.nodes):
        hosts.nodes[rank] = info
    if hosts.master is not None:
        hosts.wait(label, "set_master", [handle.set_master.remote(*hosts.master)], left, START_BOUND)
    for role, spec in hosts.specs.items():
        left = max(1.0, deadline - time.monotonic())
        ref = handle.add_role.remote(role, spec.cls, spec.args, spec.kwargs)
        layouts = list(hosts.layout(role))
        layouts[rank] = hosts.wait(role, "__init__", [ref], left, START_BOUND)[0]
        check_layout(role, layouts)
        hosts.layouts[role] = layouts
    return info


def _start_host(hosts: HostSet, rank: int, deadline: float) -> Any:
    """The new host actor on `rank`'s bundle, under the rank's name once Ray has released it."""
    import ray

    from quartet.cluster.host import RoleHost

    assert hosts.pool is not None
    slot = hosts.pool.slots[rank]
    local_rank = sum(1 for s in hosts.pool.slots[:rank] if s.node_id == slot.node_id)
    name = hosts.names.actor_name(hosts.label, rank)
    options = host_options(hosts.pool, slot, name, hosts.names.namespace, hosts.max_concurrency)
    remote_host, world = ray.remote(RoleHost).options(**options), hosts.pool.world_size
    while True:
        try:
            return remote_host.remote(rank, world, local_rank, name, threads=host_threads(hosts.pool))
        except ValueError as err:  # "already taken": the dead actor's name is released a moment later
            if "already taken" not in str(err) or time.monotonic() >= deadline:
                raise WorkerError(
                    hosts.label, rank, hosts.node_of(rank), f"could not start a new host: {err}"
                ) from err
            time.sleep(_NAME_POLL_S)
