"""Finding a run's workers from another process, by (address, namespace, prefix), or failing with the facts.

The failure this replaces: a process joins the cluster in a different namespace (or a different cluster)
and silently sees "0 actors". Here a shortfall raises `WorkerDiscoveryError` listing what was searched and
where actors with that prefix actually are.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from quartet.cluster.connect import join_bounded, target_of
from quartet.cluster.errors import WorkerDiscoveryError
from quartet.cluster.naming import parse_actor_name

__all__ = ["find_workers", "named_actors"]

log = logging.getLogger(__name__)


def named_actors() -> list[dict[str, str]]:
    """Every named actor of the connected cluster: [{'name', 'namespace'}]."""
    import ray

    return list(ray.util.list_named_actors(all_namespaces=True))


def find_workers(
    address: str, namespace: str, prefix: str, expected: int, timeout_s: float = 30.0
) -> list[Any]:
    """Handles of the actors named `<prefix>:<label>:<rank>` in `namespace`, sorted by (label, rank).

    Joins the cluster at `address` (`auto`, `host:port`, `ray://...`) in `namespace` if this process is not
    connected yet (within `timeout_s`, else `RayConnectError` naming the cause). Polls until `expected`
    workers are found or `timeout_s` passes, then raises.
    """
    import ray

    if not ray.is_initialized():  # bounded by timeout_s; the machine's Ray token when the cluster needs one
        target = target_of(address, "find_workers(address=...)")
        join_bounded(target, namespace, timeout_s, log_to_driver=False)
    current = ray.get_runtime_context().namespace
    want = prefix if prefix.endswith(":") else prefix + ":"
    deadline = time.monotonic() + timeout_s
    while True:
        everything = named_actors()
        mine = sorted(
            (parsed[1], parsed[2], a["name"])
            for a in everything
            if a["namespace"] == namespace
            and a["name"].startswith(want)
            and (parsed := parse_actor_name(a["name"]))
        )
        log.debug("lookup ns=%s prefix=%s: %d of %d", namespace, prefix, len(mine), expected)
        if len(mine) >= expected:
            return [ray.get_actor(name, namespace=namespace) for _, _, name in mine]
        if time.monotonic() >= deadline:
            raise WorkerDiscoveryError(
                _explain(address, namespace, current, prefix, expected, mine, everything)
            )
        time.sleep(0.2)


def _explain(
    address: str,
    namespace: str,
    current: str,
    prefix: str,
    expected: int,
    found: list[tuple[str, int, str]],
    everything: list[dict[str, str]],
) -> str:
    import ray

    elsewhere: dict[str, int] = {}
    for a in everything:
        if a["name"].startswith(prefix) and a["namespace"] != namespace:
            elsewhere[a["namespace"]] = elsewhere.get(a["namespace"], 0) + 1
    namespaces = sorted({a["namespace"] for a in everything})
    lines = [
        f"found {len(found)} of {expected} workers with prefix '{prefix}' in namespace '{namespace}'",
        f"  cluster address: {address or 'auto'} (connected to {ray.get_runtime_context().gcs_address}), "
        f"this process's namespace: '{current}'",
        f"  found: {[name for _, _, name in found]}",
    ]
    if elsewhere:
        where = ", ".join(f"'{ns}' ({n} actor(s))" for ns, n in sorted(elsewhere.items()))
        lines.append(f"  actors with this prefix exist in namespace(s): {where}; pass that namespace")
    else:
        lines.append(
            "  no namespace holds actors with this prefix: is the run started, and is this the right cluster?"
        )
    lines.append(f"  namespaces with named actors: {namespaces}")
    return "\n".join(lines)
