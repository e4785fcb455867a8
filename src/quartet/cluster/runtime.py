"""Start a run's role hosts from its cluster config, on Ray or in-process (`cluster.backend`).

names = RunNames.new(cfg.cluster.namespace, cfg.trainer.experiment_name)
hosts = launch(cfg.cluster, names, actor=RoleSpec(Actor, cfg.actor), critic=RoleSpec(Critic, cfg.critic))
"""

from __future__ import annotations

import dataclasses
import time

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.early_hosts import discard_taken, prewarm_timing, take_early_hosts
from quartet.cluster.hostset import HostSet
from quartet.cluster.local import colocate_local
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.ray_session import connect, connection, take_early_connect_seconds
from quartet.config.cluster import MAIN_POOL, Backend, ClusterConfig

__all__ = ["connect", "connection", "launch"]


def launch(
    cfg: ClusterConfig,
    names: RunNames,
    label: str = "",
    max_concurrency: int = 1,
    pool: str = MAIN_POOL,
    **roles: RoleSpec,
) -> HostSet:
    """Host every role on pool `pool` (`main` or a separate role's) of `cfg` (Ray), or in this process
    (`backend=local`).

    `max_concurrency` > 1 lets each host run that many calls at once in threads (a rollout replica takes
    weights while it generates); its roles must then be safe to call from several threads.
    """
    if cfg.backend == Backend.LOCAL:
        began = time.perf_counter()
        hosts = colocate_local(names, label, cfg.call_timeout_s, **roles)
        hosts.timing["roles"] = time.perf_counter() - began
        return hosts
    began = time.perf_counter()
    address = connect(cfg)
    connected = time.perf_counter()
    names = dataclasses.replace(names, address=names.address or address)
    early = take_early_hosts(cfg, names, label, max_concurrency, pool)  # started while the driver imported
    resources = early.pool if early is not None else ResourcePool.from_config(cfg, pool)
    pooled = time.perf_counter()
    started = early.handles if early is not None else ()
    try:
        call_s, start_s = cfg.call_timeout_s, cfg.start_timeout_s
        hosts = colocate(resources, names, label, call_s, start_s, max_concurrency, started, **roles)
    except BaseException:
        if early is not None:  # colocate shuts its hosts down, but may fail before it holds them
            discard_taken(early)
        raise
    early_s = take_early_connect_seconds()  # Ray started while the driver imported (`quartet train`)
    timing = {"connect": connected - began, "pool": pooled - connected}
    if early_s:
        timing["connect_early"] = early_s
    if early is not None:  # how long before this launch the hosts were started, and their imports
        timing["hosts_started_early"] = began - early.started
        timing |= prewarm_timing(early, cfg.start_timeout_s)
    hosts.timing = timing | hosts.timing
    return hosts
