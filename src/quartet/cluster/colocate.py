"""Colocation: one host actor per bundle holding every role placed there.

    pool = ResourcePool.from_config(cfg.cluster)
    hosts = colocate(pool, RunNames("quartet", "demo-20261122"), actor=RoleSpec(Actor, cfg.actor),
                     critic=RoleSpec(Critic, cfg.critic))
    hosts.groups["critic"].compute_values(batch)
    hosts.shutdown()

Each host constructs every role object in its own process (one CUDA context per GPU); the role groups
returned are views over the same handles, owned by the `HostSet` (see `hostset.py` for why it is
registered until shutdown). Separate pools (a reward model on its own bundles) call `colocate` per pool.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from quartet.cluster.dispatch import check_layout
from quartet.cluster.errors import DispatchError
from quartet.cluster.group import RoleGroup, driver_methods
from quartet.cluster.host import Sibling
from quartet.cluster.host_actors import host_options, start_host_actors
from quartet.cluster.hostset import START_BOUND, HostSet, live_runs
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool

__all__ = ["HostSet", "RoleSpec", "colocate", "host_options", "live_runs", "start_roles"]

log = logging.getLogger(__name__)


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


def check_roles(roles: dict[str, RoleSpec]) -> None:
    """Declarations are checked on the driver before any process starts."""
    if not roles:
        raise DispatchError("colocate() needs at least one role, e.g. actor=RoleSpec(Actor, cfg.actor)")
    started: list[str] = []
    for role, spec in roles.items():
        driver_methods(role, spec.cls)
        for value in (*spec.args, *spec.kwargs.values()):
            if isinstance(value, Sibling) and value.role not in started:
                raise DispatchError(
                    f"role '{role}' takes Sibling('{value.role}'), which must be a role listed before it in "
                    f"the same colocate/launch call; listed before it: {started or 'none'}"
                )
        started.append(role)


def start_roles(hosts: HostSet, roles: dict[str, RoleSpec], timeout_s: float) -> HostSet:
    """On started hosts: node facts, the torch.distributed master, then each role object on every host.

    Any failure shuts the hosts down before it propagates, so nothing is left behind.
    """
    label = hosts.label
    hosts.register()
    began = time.perf_counter()
    try:
        infos = [h.node_info.remote() for h in hosts.handles]
        hosts.nodes = hosts.wait(label, "start", infos, timeout_s, START_BOUND)
        hosts.timing["hosts"] = time.perf_counter() - began  # the host processes up (Python, imports)
        free_port = [hosts.handles[0].free_port.remote()]
        port = hosts.wait(label, "free_port", free_port, timeout_s, START_BOUND)[0]
        hosts.master = (str(hosts.nodes[0]["ip"]), int(port))
        master = [h.set_master.remote(*hosts.master) for h in hosts.handles]
        hosts.wait(label, "set_master", master, timeout_s, START_BOUND)
        for role, spec in roles.items():
            began = time.perf_counter()
            refs = [h.add_role.remote(role, spec.cls, spec.args, spec.kwargs) for h in hosts.handles]
            layout = hosts.wait(role, "__init__", refs, timeout_s, START_BOUND)
            hosts.timing[f"role/{role}"] = time.perf_counter() - began  # the role built: its model loaded
            check_layout(role, layout)
            hosts.layouts[role] = layout
            hosts.specs[role] = spec
            hosts.groups[role] = RoleGroup(role, spec.cls, hosts)
    except BaseException:
        hosts.shutdown()
        raise
    log.info("started %s on %d %s host(s) as %s", list(roles), len(hosts.handles), hosts.backend, label)
    return hosts


def colocate(
    pool: ResourcePool,
    names: RunNames,
    label: str = "",
    call_timeout_s: float = 3600.0,
    start_timeout_s: float = 120.0,
    max_concurrency: int = 1,
    started_hosts: Sequence[Any] = (),
    **roles: RoleSpec,
) -> HostSet:
    """Start ONE host actor per bundle of `pool`, construct every role in each, return the HostSet.

    `max_concurrency` > 1 makes the hosts threaded Ray actors running that many calls at once.
    `started_hosts`: the hosts of `pool` already started under these names (`quartet.cluster.early_hosts`),
    one per bundle in rank order; none are started then."""
    check_roles(roles)
    hosts = HostSet(pool, names, label or "-".join(roles), call_timeout_s)
    hosts.max_concurrency = max_concurrency
    hosts.start_timeout_s = start_timeout_s
    if started_hosts:
        if len(started_hosts) != pool.world_size:
            raise DispatchError(f"{len(started_hosts)} started hosts for a pool of {pool.world_size} bundles")
        hosts.handles.extend(started_hosts)
    else:
        hosts.handles.extend(start_host_actors(pool, names, hosts.label, max_concurrency))
    return start_roles(hosts, roles, start_timeout_s)
