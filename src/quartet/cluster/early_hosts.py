"""Host processes started as soon as Ray is up, while the driver still imports and prepares.

A host process spends its first seconds importing Python, torch, transformers and the role classes. Started
at the launch, after the driver's own imports, data and memory plan, those seconds add up with the rest.
`quartet train` therefore starts the main pool's hosts right after it connects (on the main thread, while
another thread imports the trainer; `quartet.cluster.ray_session.connect_while_importing`), under the names
the run will use, and asks each to import the role modules of the run's step plan (`RoleHost.prewarm`).
The launch of the main pool then takes them (`take_early_hosts`) and only builds the roles.

They are taken only by a launch of the same cluster config, names, label and concurrency; any other launch
discards them first. Nothing is started for the local backend or with `cluster.separate_pools` (whose pools
must be placed first). A failure to start them early is logged and left to the launch, which starts the
hosts as always and reports what fails. `discard_early_hosts` (the command's `finally`) kills what no
launch took: hosts of a run that failed before its launch never outlive its command.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from quartet.cluster.host_actors import start_host_actors
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.config.cluster import MAIN_POOL, Backend, ClusterConfig, DeviceKind
from quartet.config.roles import Role

__all__ = [
    "HOST_MODULES",
    "MAIN_LABEL",
    "ROLE_MODULES",
    "EarlyHosts",
    "discard_early_hosts",
    "discard_taken",
    "prewarm_timing",
    "early_names",
    "start_early_hosts",
    "take_early_hosts",
]

log = logging.getLogger(__name__)

MAIN_LABEL = "rl"
"""The host label of an RL run's main pool (its actors are named `<prefix>:rl:<rank>`)."""

ROLE_MODULES: dict[Role, str] = {
    Role.ACTOR: "quartet.roles.actor",
    Role.ROLLOUT: "quartet.roles.rollout.role",
    Role.REFERENCE: "quartet.roles.reference",
    Role.CRITIC: "quartet.roles.critic",
    Role.REWARD_MODEL: "quartet.roles.reward_model",
    Role.TEACHER: "quartet.roles.teacher",
}
"""The module of each role's class: what a host imports before its role is added."""

HOST_MODULES = ("quartet.engines.engine", "quartet.rollout.torch.engine")
"""What every RL host imports to build its roles beyond their classes (which import them when built): the
training engine (torch, transformers' models, FSDP2, peft) and the built-in rollout engine."""


@dataclass
class EarlyHosts:
    """The main pool's hosts (label `MAIN_LABEL`, one call at a time), started before the launch that will
    take them."""

    cluster: ClusterConfig
    names: RunNames
    pool: ResourcePool
    handles: list[Any]
    started: float
    """`time.perf_counter()` when they were started."""
    started_unix: float
    """`time.time()` then (a host's `prewarm` answer says when it began, by the same clock)."""
    prewarms: list[Any]
    """The pending `prewarm` calls, one per host (their answers: modules imported, seconds)."""


EARLY_POOL_TIMEOUT_S = 10.0
"""Longest wait to place the main pool early; past it the launch places it (and explains a failure)."""

_held: EarlyHosts | None = None
"""The one set of early hosts not taken yet (a new one discards the last)."""
_LOCK = threading.Lock()


def start_early_hosts(cluster: ClusterConfig, names: RunNames, modules: Sequence[str]) -> EarlyHosts | None:
    """On a connected Ray: the main pool's placement group and its hosts under `names`, each asked to
    import `modules`; kept for `take_early_hosts`. None (nothing started) for the local backend, with
    separate pools, or when starting fails (logged; the launch starts them as always)."""
    if cluster.backend != Backend.RAY or cluster.separate_pools:
        return None
    discard_early_hosts()  # one set at a time: an earlier one no launch took is not this run's
    began, began_unix = time.perf_counter(), time.time()
    pool: ResourcePool | None = None
    try:
        pool = _placed_pool(cluster)
        handles = start_host_actors(pool, names, MAIN_LABEL)
        prewarms = [h.prewarm.remote(list(modules)) for h in handles]
    except Exception as err:  # the launch starts them again and reports this failure properly
        log.info("hosts not started early (%s: %s); the launch starts them", type(err).__name__, err)
        if pool is not None:
            _release(pool, [])
        return None
    global _held
    early = EarlyHosts(cluster, names, pool, handles, began, began_unix, prewarms)
    with _LOCK:
        _held = early
    log.info("started %d host(s) early as %s", len(handles), names.actor_prefix(MAIN_LABEL))
    return early


def _placed_pool(cluster: ClusterConfig) -> ResourcePool:
    """The main pool placed, waiting at most `EARLY_POOL_TIMEOUT_S`: a pool that cannot be placed at once
    is left to the launch, which waits `cluster.pool_timeout_s` and explains what is missing."""
    import ray

    use_gpu = cluster.device is DeviceKind.GPU or (
        cluster.device is DeviceKind.AUTO and ray.cluster_resources().get("GPU", 0) > 0  # type: ignore[no-untyped-call]
    )
    planned = ResourcePool.planned(cluster, MAIN_POOL, use_gpu)
    planned.timeout_s = min(planned.timeout_s, EARLY_POOL_TIMEOUT_S)
    return planned.create()


def early_names(cluster: ClusterConfig) -> RunNames | None:
    """The names the early hosts of a run with `cluster` were started under (the run must use them), or
    None."""
    with _LOCK:
        return _held.names if _held is not None and _held.cluster == cluster else None


def take_early_hosts(
    cluster: ClusterConfig, names: RunNames, label: str, max_concurrency: int, pool: str
) -> EarlyHosts | None:
    """The early hosts for this launch, handed over (they leave this module), or None. Early hosts of
    another config, names, label, concurrency or pool are discarded: no launch could take them after."""
    taken = _take()
    if taken is None:
        return None
    same = (
        taken.cluster == cluster
        and (taken.names.namespace, taken.names.prefix) == (names.namespace, names.prefix)
        and (label, max_concurrency, pool) == (MAIN_LABEL, 1, MAIN_POOL)
    )
    if not same:
        log.info("early hosts of %s not taken by the launch of %s; discarded", taken.names.prefix, label)
        _release(taken.pool, taken.handles)
        return None
    return taken


def prewarm_timing(early: EarlyHosts, timeout_s: float) -> dict[str, float]:
    """For the start-up record, once the hosts answered: seconds from the early start to the slowest
    host's first call (`hosts_process`: its process up) and that host's imports (`hosts_prewarm`)."""
    import ray

    try:
        answers = ray.get(early.prewarms, timeout=timeout_s)
    except Exception as err:  # the figures are for the record only: a host that answered its roles runs
        log.warning("no prewarm figures from the early hosts: %s: %s", type(err).__name__, err)
        return {}
    return {
        "hosts_process": max(a["began_unix"] for a in answers) - early.started_unix,
        "hosts_prewarm": max(a["seconds"] for a in answers),
    }


def discard_taken(early: EarlyHosts) -> None:
    """Kill taken early hosts whose launch failed before their host set held them."""
    _release(early.pool, early.handles)


def discard_early_hosts() -> int:
    """Kill the early hosts no launch took and release their placement group; how many were killed."""
    left = _take()
    if left is None:
        return 0
    _release(left.pool, left.handles)
    return len(left.handles)


def _take() -> EarlyHosts | None:
    """The held early hosts, no longer held."""
    global _held
    with _LOCK:
        taken, _held = _held, None
    return taken


def _release(pool: ResourcePool, handles: Sequence[Any]) -> None:
    import ray

    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception as err:  # already gone: nothing to release
            log.debug("kill %s: %s", handle, err)
    try:
        pool.remove()
    except Exception as err:  # Ray is gone: so is the placement group
        log.debug("remove placement group: %s", err)
