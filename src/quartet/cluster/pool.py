"""Resource pools: bundles (device slots) on one or more nodes, held by Ray placement groups.

A pool is created only after checking that enough nodes have the free resources it asks for; the wait
for the placement groups is bounded, and both failures name what is missing. Ranks are ordered by node
(IP, then node id) and bundle index, so they are the same every time the same cluster builds the pool.

`PACK` over one node is one STRICT_PACK group of `bundles_per_node` bundles. Over several nodes it is
one STRICT_SPREAD group with one node-sized bundle per node (its ranks' resources summed), so the nodes
are guaranteed distinct: separate per-node STRICT_PACK groups (verl's layout) may all land on one node
when it has room, and then `nodes=2` silently means one node.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from quartet.cluster.errors import ResourcesUnavailableError
from quartet.config.cluster import MAIN_POOL, ClusterConfig, DeviceKind, PlacementStrategy

__all__ = ["BundleSlot", "ResourcePool", "auto_cpus_per_bundle"]

log = logging.getLogger(__name__)
_RELEASE_GRACE_S = 5.0  # longest wait for resources that the cluster has but that are still held


@dataclass(frozen=True)
class BundleSlot:
    """Where one rank lives: a bundle of a placement group on a node."""

    rank: int
    placement_group: Any  # ray.util.placement_group.PlacementGroup
    bundle_index: int  # several ranks share one node-sized bundle in a multi-node PACK pool
    node_id: str
    node_ip: str


@dataclass
class ResourcePool:
    """Bundles of `cpus_per_bundle` CPUs (+`gpus_per_bundle` GPU each on GPU), `bundles_per_node` on each of
    `nodes` nodes."""

    nodes: int
    bundles_per_node: int
    cpus_per_bundle: float
    use_gpu: bool
    strategy: PlacementStrategy = PlacementStrategy.PACK
    timeout_s: float = 60.0
    slots: list[BundleSlot] = field(default_factory=list)
    gpus_per_bundle: float = 1.0
    """Below 1: this pool shares each GPU with another pool (`cluster.gpu_fraction`)."""
    keep_freed_memory: bool = True
    """The pool's hosts keep the memory they free (`cluster.keep_freed_memory`, `cluster.host_memory`)."""

    @classmethod
    def from_config(cls, cfg: ClusterConfig, pool: str = MAIN_POOL) -> ResourcePool:
        """Create pool `pool` (`main` or a separate role's) of `cfg` (GPU when cfg.device says so, or when
        `auto` finds GPUs; `cluster.gpu_fraction.<pool>` of a GPU per bundle)."""
        import ray

        use_gpu = cfg.device is DeviceKind.GPU or (
            cfg.device is DeviceKind.AUTO and ray.cluster_resources().get("GPU", 0) > 0  # type: ignore[no-untyped-call]
        )
        return cls.planned(cfg, pool, use_gpu).create()

    @classmethod
    def planned(cls, cfg: ClusterConfig, pool: str, use_gpu: bool) -> ResourcePool:
        """Pool `pool` of `cfg` as it will be asked of Ray, before any placement group exists."""
        cpus = (
            cfg.pool_cpus.of(pool)
            or cfg.cpus_per_bundle
            or auto_cpus_per_bundle(cfg.bundles_per_node, len(cfg.pools))
        )
        return cls(
            cfg.nodes,
            cfg.bundles_per_node,
            cpus,
            use_gpu,
            cfg.strategy,
            cfg.pool_timeout_s,
            gpus_per_bundle=cfg.gpu_fraction.of(pool),
            keep_freed_memory=cfg.keep_freed_memory,
        )

    @property
    def world_size(self) -> int:
        return self.nodes * self.bundles_per_node

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus_per_bundle, **({"GPU": self.gpus_per_bundle} if self.use_gpu else {})}

    def create(self) -> ResourcePool:
        """Check resources, create the placement groups, wait (bounded) and order the ranks."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        self._check_capacity()
        ranks_per_bundle = 1
        if self.strategy is PlacementStrategy.PACK and self.nodes == 1:
            groups = [placement_group([self.bundle()] * self.bundles_per_node, strategy="STRICT_PACK")]
        elif self.strategy is PlacementStrategy.PACK:
            node_bundle = {k: v * self.bundles_per_node for k, v in self.bundle().items()}
            groups = [placement_group([node_bundle] * self.nodes, strategy="STRICT_SPREAD")]
            ranks_per_bundle = self.bundles_per_node
        else:
            groups = [placement_group([self.bundle()] * self.world_size, strategy="SPREAD")]
        ready, _ = ray.wait([pg.ready() for pg in groups], num_returns=len(groups), timeout=self.timeout_s)
        if len(ready) < len(groups):
            for pg in groups:
                remove_placement_group(pg)
            raise ResourcesUnavailableError(
                f"placement groups for {self.describe()} were not placed within {self.timeout_s:.0f} s "
                f"(cluster.pool_timeout_s); free resources now: {_free_by_node()}"
            )
        self.slots = _ordered_slots(groups, ranks_per_bundle)
        log.debug("resource pool ready: %s", [(s.rank, s.node_ip, s.bundle_index) for s in self.slots])
        return self

    def describe(self) -> str:
        return (
            f"{self.nodes} node(s) x {self.bundles_per_node} bundle(s) of {self.bundle()} "
            f"({self.strategy.value})"
        )

    def _fits(self, by_node: dict[str, dict[str, float]]) -> tuple[bool, int]:
        """Whether resources `by_node` can hold the pool, and how many nodes qualify for a pack."""
        need = self.bundle()
        per_node = self.bundles_per_node if self.strategy is PlacementStrategy.PACK else 1
        fitting = sum(
            all(res.get(k, 0.0) + 1e-9 >= v * per_node for k, v in need.items()) for res in by_node.values()
        )
        if self.strategy is PlacementStrategy.PACK:
            return fitting >= self.nodes, fitting
        total = {k: sum(r.get(k, 0.0) for r in by_node.values()) for k in need}
        return all(total[k] + 1e-9 >= v * self.world_size for k, v in need.items()), fitting

    def _check_capacity(self) -> None:
        """Fail at once if the cluster could never hold the pool. If it could but the resources are taken,
        wait a moment: Ray's view of free resources lags behind pools and actors released just before."""
        free = _free_by_node()
        enough, fitting = self._fits(free)
        if not enough and self._fits(_free_by_node(totals=True))[0]:
            deadline = time.monotonic() + _RELEASE_GRACE_S
            while not enough and time.monotonic() < deadline:
                time.sleep(0.1)
                free = _free_by_node()
                enough, fitting = self._fits(free)
        if not enough:
            per_node = self.bundles_per_node if self.strategy is PlacementStrategy.PACK else 1
            raise ResourcesUnavailableError(
                f"the cluster cannot hold {self.describe()}: it needs {self.nodes} node(s) with "
                f"{ {k: v * per_node for k, v in self.bundle().items()} } free each, and "
                f"{fitting} node(s) qualify; free resources by node: {free}. "
                "Fix: lower cluster.nodes / cluster.bundles_per_node / cluster.cpus_per_bundle "
                "(on one GPU: cluster.gpu_fraction.<pool> summing to at most 1), "
                "or add resources (e.g. a larger num_cpus for the local Ray)"
            )

    def remove(self) -> None:
        """Release the placement groups."""
        from ray.util.placement_group import remove_placement_group

        for pg in {id(s.placement_group): s.placement_group for s in self.slots}.values():
            remove_placement_group(pg)
        self.slots = []


def auto_cpus_per_bundle(bundles_per_node: int, pools: int) -> float:
    """`cluster.cpus_per_bundle: 0`: the smallest alive node's CPUs split evenly over `pools` pools of
    `bundles_per_node` bundles each, capped by what is free there (a shared cluster's other jobs keep
    theirs), rounded down to whole CPUs (torch threads), at least 1. Ray's view of free CPUs lags behind
    pools released just before (the stage before this one), so a short shortfall is waited out."""
    totals = [res.get("CPU", 0.0) for res in _free_by_node(totals=True).values()]
    share = int(min(totals, default=1.0) // max(1, bundles_per_node * pools))
    deadline = time.monotonic() + _RELEASE_GRACE_S
    while True:
        free = [res.get("CPU", 0.0) for res in _free_by_node().values()]
        fits = int(min(free, default=1.0) // max(1, bundles_per_node))
        if fits >= share or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    share = min(share, fits)
    log.info(
        "cluster.cpus_per_bundle=0: %d CPU(s) per bundle (CPUs %s, free %s)", max(1, share), totals, free
    )
    return float(max(1, share))


def _free_by_node(totals: bool = False) -> dict[str, dict[str, float]]:
    """Free (or, with `totals`, all) CPU/GPU per alive node, keyed by `ip/node-id-prefix`."""
    import ray

    available: dict[str, dict[str, float]] = {}
    try:
        # per-node availability: no public API gives it without the dashboard
        from ray._private.state import state

        per_node = {} if totals else state.available_resources_per_node()  # type: ignore[no-untyped-call]
    except Exception:  # pragma: no cover - fall back to cluster totals
        per_node = {}
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if not node.get("Alive"):
            continue
        res = per_node.get(node["NodeID"], node["Resources"])
        key = f"{node['NodeManagerAddress']}/{node['NodeID'][:8]}"
        available[key] = {k: float(res.get(k, 0.0)) for k in ("CPU", "GPU") if k in res or k == "CPU"}
    return available


def _ordered_slots(groups: list[Any], ranks_per_bundle: int) -> list[BundleSlot]:
    import ray
    from ray.util.placement_group import placement_group_table

    ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}  # type: ignore[no-untyped-call]
    entries: list[tuple[str, str, Any, int]] = []
    for pg in groups:
        table = placement_group_table(pg)
        for index, node_id in table["bundles_to_node_id"].items():
            entries.extend((ips.get(node_id, "?"), node_id, pg, int(index)) for _ in range(ranks_per_bundle))
    entries.sort(key=lambda e: (e[0], e[1], e[3]))
    return [BundleSlot(rank, pg, index, node, ip) for rank, (ip, node, pg, index) in enumerate(entries)]
