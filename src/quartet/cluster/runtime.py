"""Start a run's role hosts from its cluster config, on Ray or in-process (`cluster.backend`).

names = RunNames.new(cfg.cluster.namespace, cfg.trainer.experiment_name)
hosts = launch(cfg.cluster, names, actor=RoleSpec(Actor, cfg.actor), critic=RoleSpec(Critic, cfg.critic))
"""

from __future__ import annotations

import dataclasses
import logging
import time

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.connect import join_bounded, resolve_target
from quartet.cluster.hostset import HostSet
from quartet.cluster.local import colocate_local
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.reaper import start_reaper
from quartet.config.cluster import Backend, ClusterConfig

__all__ = ["connect", "connection", "launch"]

log = logging.getLogger(__name__)
# A local Ray started by quartet sends objects up to 1 MiB inline with the call instead of through the
# object store (Ray's default is 100 KiB): a split call on a 1 MiB Batch over 4 ranks went from ~19 ms
# to ~13 ms (benchmarks/dispatch_overhead.py --inline-kib 1024). Larger Batches still use the store.
_LOCAL_RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 1 << 20}


_CONNECTION = {"ray": ""}  # how this process got its Ray (for the run's log)


def connection() -> str:
    """How this process got its Ray, e.g. "joined the Ray cluster at 10.0.0.5:6379 (RAY_ADDRESS is set
    ...)"; empty before `connect`."""
    return _CONNECTION["ray"]


def connect(cfg: ClusterConfig) -> str:
    """Join the Ray cluster `cfg.address` means (`quartet.cluster.connect`), or start a local one, in
    `cfg.namespace`; its GCS address. The log says which, and why.

    A process already connected keeps its connection, but must be in the run's namespace: named actors
    live in one namespace, and a mismatch is how other tools end up finding "0 actors".
    """
    import ray

    if ray.is_initialized():
        current = ray.get_runtime_context().namespace
        if current != cfg.namespace:
            raise RuntimeError(
                f"this process is connected to Ray in namespace '{current}', but cluster.namespace is "
                f"'{cfg.namespace}'; set cluster.namespace={current} or call ray.shutdown() first"
            )
        return str(ray.get_runtime_context().gcs_address)
    target = resolve_target(cfg.address, min(cfg.connect_timeout_s, 5.0))
    if target.mode == "join":
        if cfg.num_cpus:
            log.warning(
                "cluster.num_cpus=%d applies to a local Ray this run starts; ignored: joining %s",
                cfg.num_cpus,
                target.describe(),
            )
        join_bounded(target, cfg.namespace, cfg.connect_timeout_s, log_to_driver=True)
    else:
        ray.init(
            address="local",  # never a stale `ray start` record or RAY_ADDRESS: resolve_target decided
            namespace=cfg.namespace,
            num_cpus=cfg.num_cpus or None,
            log_to_driver=True,
            _system_config=_LOCAL_RAY_SYSTEM_CONFIG,
        )
    address = str(ray.get_runtime_context().gcs_address)
    verb = "joined" if target.mode == "join" else "started"
    _CONNECTION["ray"] = f"{verb} {target.describe()}: GCS {address}, namespace '{cfg.namespace}'"
    log.info("Ray: %s", _CONNECTION["ray"])
    _watch_local_session()
    return address


def _watch_local_session() -> None:
    """When this process started its Ray (not joined one), its agents leave with it, even on a SIGKILL
    (`quartet.cluster.reaper`; Ray's own agents would outlive it by ~62 s)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)  # private: no public "did I start it"
    if node is None or not getattr(node, "head", False):
        return
    try:
        session = str(node.get_session_dir_path())
    except Exception as err:  # pragma: no cover - another Ray version: Ray's own timing applies
        log.debug("no session folder to watch: %s", err)
        return
    start_reaper(session)


def launch(
    cfg: ClusterConfig, names: RunNames, label: str = "", max_concurrency: int = 1, **roles: RoleSpec
) -> HostSet:
    """Host every role on the pool `cfg` describes (Ray), or in this process (`backend=local`).

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
    pool = ResourcePool.from_config(cfg)
    pooled = time.perf_counter()
    hosts = colocate(pool, names, label, cfg.call_timeout_s, cfg.pool_timeout_s, max_concurrency, **roles)
    hosts.timing = {"connect": connected - began, "pool": pooled - connected, **hosts.timing}
    return hosts
