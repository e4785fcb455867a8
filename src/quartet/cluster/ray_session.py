"""This process's Ray connection: join the cluster a config names, or start a local one.

Light on purpose: it imports neither torch nor the role hosts, so `quartet train` can start (or join) Ray
on its main thread while another thread imports the trainer (`connect_while_importing`): on a machine where
Ray starts in ~3.5 s and the imports take ~4 s, the two overlap instead of adding up, and the run's hosts
start right after the connect (`quartet.cluster.early_hosts`).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from quartet.cluster.connect import join_bounded, resolve_target
from quartet.cluster.reaper import start_reaper
from quartet.config.cluster import ClusterConfig

__all__ = ["connect", "connect_while_importing", "connection", "take_early_connect_seconds"]

log = logging.getLogger(__name__)
# A local Ray started by quartet sends objects up to 1 MiB inline with the call instead of through the
# object store (Ray's default is 100 KiB): a split call on a 1 MiB Batch over 4 ranks went from ~19 ms
# to ~13 ms (benchmarks/dispatch_overhead.py --inline-kib 1024). Larger Batches still use the store.
_LOCAL_RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 1 << 20}


_CONNECTION = {"ray": ""}  # how this process got its Ray (for the run's log)
_EARLY_CONNECT_S = [0.0]  # seconds of the last `connect_while_importing`, until a launch reports them


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
        token = join_bounded(target, cfg.namespace, cfg.connect_timeout_s, log_to_driver=True)
    else:
        ray.init(
            address="local",  # never a stale `ray start` record or RAY_ADDRESS: resolve_target decided
            namespace=cfg.namespace,
            num_cpus=cfg.num_cpus or None,
            include_dashboard=cfg.dashboard,
            log_to_driver=True,
            _system_config=_LOCAL_RAY_SYSTEM_CONFIG,
        )
        token = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"  # Ray's choice for a local Ray
    address = str(ray.get_runtime_context().gcs_address)
    verb = "joined" if target.mode == "join" else "started"
    auth = "on" if token else "off"
    _CONNECTION["ray"] = (
        f"{verb} {target.describe()}: GCS {address}, namespace '{cfg.namespace}', token authentication {auth}"
    )
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


def take_early_connect_seconds() -> float:
    """Seconds the last `connect_while_importing` spent connecting, once (0 after, or without one): the
    start-up record's `workers/connect_early_s`."""
    seconds, _EARLY_CONNECT_S[0] = _EARLY_CONNECT_S[0], 0.0
    return seconds


def connect_while_importing(
    cfg: ClusterConfig, modules: Sequence[str], then: Callable[[], None] | None = None
) -> float:
    """`connect(cfg)` on this thread while a daemon thread imports `modules`, then `then()` (still beside
    the imports: `quartet train` starts its hosts there); returns the connect's seconds.

    Ray's start is mostly waiting for its own processes, and the imports are Python work, so on two cores
    the two overlap. The connect stays on the main thread, where Ray installs its SIGTERM handler. An error
    of any is raised once the imports are done (the connect's first).
    """
    failures: list[BaseException] = []

    def load() -> None:
        try:
            for name in modules:
                importlib.import_module(name)
        except BaseException as err:  # re-raised on the main thread below
            failures.append(err)

    loader = threading.Thread(target=load, name="quartet-imports", daemon=True)
    loader.start()
    began = time.perf_counter()
    try:
        connect(cfg)
        seconds = time.perf_counter() - began
        if then is not None:
            then()
    finally:
        loader.join()
    _EARLY_CONNECT_S[0] = seconds
    if failures:
        raise failures[0]
    return seconds
