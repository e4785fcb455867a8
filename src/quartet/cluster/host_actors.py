"""The host actors of a pool, one per bundle, started before any role is built.

Light on purpose: neither torch nor the roles are imported here (`quartet.cluster.host` imports them only
when a role is added), so the driver can start the host processes on its main thread while another thread
still imports the trainer (`quartet.cluster.early_hosts`).
"""

from __future__ import annotations

from typing import Any

from quartet.cluster.naming import RunNames
from quartet.cluster.pool import BundleSlot, ResourcePool

__all__ = ["host_options", "host_threads", "start_host_actors"]


def host_options(
    pool: ResourcePool, slot: BundleSlot, name: str, namespace: str, max_concurrency: int = 1
) -> dict[str, Any]:
    """Ray actor options of the host on `slot`: the bundle's CPUs and its GPU share (`gpus_per_bundle`,
    below 1 when pools share a GPU: Ray still names that GPU in the host's CUDA_VISIBLE_DEVICES, whereas
    `num_gpus=0` would hide every GPU from it), pinned to its placement-group bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return {
        "name": name,
        "namespace": namespace,
        "num_cpus": pool.cpus_per_bundle,
        "num_gpus": pool.gpus_per_bundle if pool.use_gpu else 0,
        "max_restarts": 0,
        "max_concurrency": max_concurrency,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=slot.placement_group, placement_group_bundle_index=slot.bundle_index
        ),
    }


def host_threads(pool: ResourcePool) -> int:
    """torch's threads in a host of `pool`: its bundle's CPUs (at least 1). The host sets them itself
    (`RoleHost(threads=)`): a `runtime_env` would cost each host a fresh worker process (~0.8 s on 2 cores)
    instead of one Ray has already started."""
    return max(1, int(pool.cpus_per_bundle))


def start_host_actors(pool: ResourcePool, names: RunNames, label: str, max_concurrency: int = 1) -> list[Any]:
    """One `RoleHost` actor per bundle of the created `pool`, named `<prefix>:<label>:<rank>`; their handles
    in rank order. The processes start now; nothing waits for them here."""
    import ray

    from quartet.cluster.host import RoleHost

    remote_host = ray.remote(RoleHost)
    handles: list[Any] = []
    local_ranks: dict[str, int] = {}
    try:
        for slot in pool.slots:
            local_rank = local_ranks.get(slot.node_id, 0)
            local_ranks[slot.node_id] = local_rank + 1
            name = names.actor_name(label, slot.rank)
            options = host_options(pool, slot, name, names.namespace, max_concurrency)
            host = remote_host.options(**options)
            setup = {"threads": host_threads(pool), "keep_freed_memory": pool.keep_freed_memory}
            handles.append(host.remote(slot.rank, pool.world_size, local_rank, name, **setup))
    except BaseException:  # a rank that cannot start (its name taken, say): none of them stays behind
        for handle in handles:
            ray.kill(handle, no_restart=True)
        raise
    return handles
