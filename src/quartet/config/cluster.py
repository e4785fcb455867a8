"""Where the run's workers live: Ray address, namespace, resource pool shape, timeouts."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from quartet.config.errors import ConfigError, require
from quartet.config.roles import Role

__all__ = [
    "MAIN_POOL",
    "SEPARABLE_ROLES",
    "Backend",
    "ClusterConfig",
    "DeviceKind",
    "GpuFraction",
    "PlacementStrategy",
    "PoolCpus",
    "gpu_share_problems",
]

SEPARABLE_ROLES = (Role.ROLLOUT, Role.REFERENCE, Role.CRITIC, Role.REWARD_MODEL, Role.TEACHER)
"""Roles that `cluster.separate_pools` may move off the actor's pool. A separate `rollout` gets the actor's
weights over a weight-sync group (`rollout.weight_sync`) instead of in-process, and is what lets
`trainer.mode=one_step_off|async` generate while the actor trains."""


class Backend(StrEnum):
    """What runs the role groups."""

    RAY = "ray"  # Ray actors on a resource pool: the default, and the path of every distributed run
    LOCAL = "local"  # in the driver process, one rank, no Ray: for debuggers and machines without Ray


class DeviceKind(StrEnum):
    """Device of each bundle."""

    AUTO = "auto"  # GPU when the cluster has GPUs, else CPU
    CPU = "cpu"
    GPU = "gpu"


class PlacementStrategy(StrEnum):
    """How a pool's bundles are placed on nodes."""

    PACK = "pack"  # each node's ranks packed on it; nodes guaranteed distinct (STRICT_SPREAD)
    SPREAD = "spread"  # bundles spread across nodes


MAIN_POOL = "main"
"""Name of the pool that holds the actor (and every role not in `cluster.separate_pools`)."""


@dataclass(frozen=True)
class GpuFraction:
    """Share of one GPU each pool's bundle takes (`cluster.gpu_fraction.<pool>`), in (0, 1].

    1 (the default): a bundle owns a whole GPU. Below 1, the pools below 1 share ONE GPU per bundle:
    e.g. `main: 0.5, rollout: 0.5` with `separate_pools: [rollout]` puts the actor and a rollout pool of its
    own on one GPU, so `trainer.mode=one_step_off|async` overlaps generation and training there. Ray gives
    each host a fractional GPU (its CUDA_VISIBLE_DEVICES names the shared device, `cuda:0` in every
    process); the fractions only place the processes, they do not cap memory: `quartet plan` counts every
    sharing pool's memory on the one device."""

    main: float = 1.0
    """The main pool (actor, and every role not in `separate_pools`)."""

    rollout: float = 1.0
    """The rollout pool, when `rollout` is in `separate_pools`."""

    reference: float = 1.0
    """The reference pool, when `reference` is in `separate_pools`."""

    critic: float = 1.0
    """The critic pool, when `critic` is in `separate_pools`."""

    reward_model: float = 1.0
    """The reward-model pool, when `reward_model` is in `separate_pools`."""

    teacher: float = 1.0
    """The teacher pool (on-policy distillation), when `teacher` is in `separate_pools`."""

    def __post_init__(self) -> None:
        for pool in (MAIN_POOL, *SEPARABLE_ROLES):
            value = getattr(self, str(pool))
            require(
                0.0 < value <= 1.0,
                str(pool),
                f"must lie in (0, 1], got {value}",
                "a pool takes at most one whole GPU per bundle; use 1 for a GPU of its own",
            )

    def of(self, pool: str) -> float:
        """The fraction of pool `pool` (`main` or a separable role's name)."""
        return float(getattr(self, str(pool)))


@dataclass(frozen=True)
class PoolCpus:
    """CPUs of each bundle of one pool (`cluster.pool_cpus.<pool>`); 0 (the default): `cpus_per_bundle`.

    The one way to give the rollout pool and the trainer's pool unequal shares of a node's CPUs, e.g.
    `main: 3, rollout: 1` on a 4-core box whose training takes longer than its generation (the split
    advisor, `quartet.trainer.records.split_advice`, recommends these). Each bundle's workers get as many
    torch threads (whole CPUs)."""

    main: float = 0.0
    """The main pool (actor, and every role not in `separate_pools`)."""

    rollout: float = 0.0
    """The rollout pool, when `rollout` is in `separate_pools`."""

    reference: float = 0.0
    """The reference pool, when `reference` is in `separate_pools`."""

    critic: float = 0.0
    """The critic pool, when `critic` is in `separate_pools`."""

    reward_model: float = 0.0
    """The reward-model pool, when `reward_model` is in `separate_pools`."""

    teacher: float = 0.0
    """The teacher pool, when `teacher` is in `separate_pools`."""

    def __post_init__(self) -> None:
        for pool in (MAIN_POOL, *SEPARABLE_ROLES):
            value = getattr(self, str(pool))
            require(
                value >= 0.0,
                str(pool),
                f"must be >= 0, got {value}",
                "use 0 for cluster.cpus_per_bundle, or a number of CPUs per bundle of this pool",
            )

    def of(self, pool: str) -> float:
        """The CPUs per bundle of pool `pool` (`main` or a separable role's name); 0: not set."""
        return float(getattr(self, str(pool)))


@dataclass(frozen=True)
class ClusterConfig:
    """Ray cluster and resource pools of the run (every role colocated on one pool unless separated)."""

    backend: Backend = Backend.RAY
    """`ray` (actors on placement groups) or `local` (roles as plain objects in the driver, world size 1)."""

    address: str = ""
    """Which Ray the run uses. Empty: the cluster this environment points at (`RAY_ADDRESS`, which
    `ray job submit` sets, or a `ray start` cluster on this machine), else a local Ray for this run.
    `auto`: an existing cluster, required. `local`: always a local Ray for this run. `host:port` (the GCS
    address) or `ray://host:port`: that cluster. The log says which was used and why."""

    connect_timeout_s: float = 30.0
    """Longest wait to join a cluster; past it (or at once, when nothing listens) the run fails naming the
    address, the cause and the fix."""

    namespace: str = "quartet"
    """Ray namespace of the run's named actors; discovery from other processes uses it."""

    run_prefix: str = ""
    """Prefix of actor names (`<prefix>:<host>:<rank>`). Empty: `<experiment_name>-<start time>`."""

    nodes: int = 1
    """Nodes of the resource pool."""

    bundles_per_node: int = 1
    """Bundles (device slots) per node: GPUs per node on GPU, CPU slots on CPU. World size = nodes x this."""

    cpus_per_bundle: float = 1.0
    """CPUs reserved by each bundle; its workers get as many torch threads. 0 (auto): an equal share of the
    smallest node's CPUs, split over the bundles of every pool this run makes on it (the main pool and
    `separate_pools`) and capped by the CPUs free there, at least 1: on a CPU box one worker then uses every
    core, where 1 leaves all but one idle."""

    device: DeviceKind = DeviceKind.AUTO
    """Device kind of each bundle."""

    strategy: PlacementStrategy = PlacementStrategy.PACK
    """Placement of bundles over nodes."""

    num_cpus: int = 0
    """CPUs of a local Ray started by the run; 0 lets Ray detect them."""

    dashboard: bool = False
    """Ray's dashboard in a local Ray started by the run. Off, that Ray starts ~2 s sooner (5.1 s against
    2.8 s on 2 cores), but Ray's state API is missing: `ray list actors` fails and `quartet doctor` lists
    the live actors without their states. A cluster the run joins keeps its own setting (`ray start --head`
    starts one with its dashboard)."""

    keep_freed_memory: bool = True
    """Host processes (Ray actors) keep the memory they free for their next phase instead of giving it back
    to the OS (glibc's `mallopt`: no trimming, no mmap for large blocks; `quartet.cluster.host_memory`).
    Re-faulting it cost a 20M GRPO step ~1 s in its first steps on 2 cores; a host's resident size then
    stays at its peak. false: glibc's defaults. The local backend's driver is left as it is."""

    pool_timeout_s: float = 60.0
    """Longest wait for the placement groups; past it the run fails naming the missing resources."""

    call_timeout_s: float = 3600.0
    """Longest wait for one call on a worker group before the driver reports which ranks hang."""

    start_timeout_s: float = 300.0
    """Longest wait for the worker processes to start and build their roles (Python and torch imports, the
    model loaded): past it the run fails naming the silent ranks. Minutes on a busy or cold machine (a
    first import of torch and transformers under load took over 60 s here), hence 300 s, verl's wait for
    its workers to register."""

    separate_pools: tuple[Role, ...] = ()
    """Roles on a pool of their own, of the same shape as the main one (`rollout`, `reference`, `critic`,
    `reward_model`): their memory never competes with the actor's, at the price of more devices. A separate
    `rollout` pool is disaggregated RL: its engines take the actor's weights over `rollout.weight_sync`.
    With `gpu_fraction` below 1 a separate pool shares the main pool's GPU (one GPU, two processes)."""

    gpu_fraction: GpuFraction = GpuFraction()
    """Share of a GPU each pool's bundle takes (`main`, `rollout`, ...; default 1 each): below 1, pools
    share one GPU per bundle (`GpuFraction`). GPU pools only, one bundle per node."""

    pool_cpus: PoolCpus = PoolCpus()
    """CPUs per bundle of each pool (`main`, `rollout`, ...; default 0 each: `cpus_per_bundle`): unequal
    shares of a node's CPUs for the pools (`PoolCpus`)."""

    def __post_init__(self) -> None:
        require(self.nodes >= 1, "nodes", f"must be >= 1, got {self.nodes}")
        require(self.bundles_per_node >= 1, "bundles_per_node", f"must be >= 1, got {self.bundles_per_node}")
        require(
            self.cpus_per_bundle >= 0, "cpus_per_bundle", "must be >= 0", "use 0 to share the node's CPUs"
        )
        require(self.num_cpus >= 0, "num_cpus", "must be >= 0", "use 0 to let Ray detect the CPUs")
        require(bool(self.namespace), "namespace", "must not be empty", "name the run's Ray namespace")
        require(self.pool_timeout_s > 0, "pool_timeout_s", "must be > 0")
        require(self.call_timeout_s > 0, "call_timeout_s", "must be > 0")
        require(self.start_timeout_s > 0, "start_timeout_s", "must be > 0")
        require(self.connect_timeout_s > 0, "connect_timeout_s", "must be > 0")
        for role in self.separate_pools:
            require(
                role in SEPARABLE_ROLES,
                "separate_pools",
                f"'{role}' is not a role that can have its own pool",
                f"use some of {[str(r) for r in SEPARABLE_ROLES]}; the actor always stays on the main pool",
            )
        require(
            len(set(self.separate_pools)) == len(self.separate_pools), "separate_pools", "lists a role twice"
        )
        require(
            self.backend == Backend.RAY or not self.separate_pools,
            "separate_pools",
            "needs host processes of its own, but backend=local runs every role in the driver",
            "use cluster.backend=ray, or leave cluster.separate_pools empty",
        )
        require(
            self.backend == Backend.RAY or self.world_size == 1,
            "backend",
            f"local runs one rank, but nodes x bundles_per_node = {self.world_size}",
            "set cluster.nodes=1 and cluster.bundles_per_node=1, or use cluster.backend=ray",
        )

    @property
    def pools(self) -> tuple[str, ...]:
        """Names of the run's pools: `main`, then each separate role's."""
        return (MAIN_POOL, *(str(r) for r in self.separate_pools))

    @property
    def sharing_pools(self) -> dict[str, float]:
        """The pools that share one GPU per bundle (fraction below 1), with their fractions."""
        shares = {pool: self.gpu_fraction.of(pool) for pool in self.pools}
        return {pool: share for pool, share in shares.items() if share < 1.0}

    def shares_gpu(self, pool: str) -> bool:
        """Whether `pool` shares its GPU with another pool (its fraction is below 1)."""
        return str(pool) in self.sharing_pools

    @property
    def world_size(self) -> int:
        """Number of bundles, which is the data-parallel world of every colocated role."""
        return self.nodes * self.bundles_per_node


def gpu_share_problems(cfg: ClusterConfig) -> list[ConfigError]:
    """Fractions below 1 must name pools the run makes, on GPU, one bundle per node, summing to <= 1;
    `pool_cpus` may name only pools the run makes.

    Checked with the other cross-field rules (`quartet.config.validate`), once every override is in: an
    intermediate state (`main=0.7` before `rollout=0.3`) may not add up."""
    out: list[ConfigError] = []
    for role in SEPARABLE_ROLES:
        if cfg.pool_cpus.of(role) > 0.0 and role not in cfg.separate_pools:
            out.append(
                ConfigError(
                    f"cluster.pool_cpus.{role}",
                    f"is {cfg.pool_cpus.of(role):g}, but '{role}' has no pool of its own",
                    f"add {role} to cluster.separate_pools, or leave cluster.pool_cpus.{role} at 0",
                )
            )
        if cfg.gpu_fraction.of(role) < 1.0 and role not in cfg.separate_pools:
            out.append(
                ConfigError(
                    f"cluster.gpu_fraction.{role}",
                    f"is {cfg.gpu_fraction.of(role):g}, but '{role}' has no pool of its own",
                    f"add {role} to cluster.separate_pools, or leave cluster.gpu_fraction.{role} at 1",
                )
            )
    sharing = cfg.sharing_pools
    if not sharing:
        return out
    shares = " + ".join(f"{pool} {share:g}" for pool, share in sharing.items())
    if cfg.device is DeviceKind.CPU:
        out.append(
            ConfigError(
                "cluster.gpu_fraction",
                f"shares a GPU ({shares}), but cluster.device=cpu",
                "set cluster.device=gpu (or auto), or leave every cluster.gpu_fraction at 1 on CPU",
            )
        )
    if cfg.bundles_per_node != 1:
        out.append(
            ConfigError(
                "cluster.gpu_fraction",
                f"shares a GPU ({shares}) with bundles_per_node={cfg.bundles_per_node}: two ranks of one "
                "pool could land on the same GPU",
                "set cluster.bundles_per_node=1 (one GPU per node), or leave every cluster.gpu_fraction at 1",
            )
        )
    total = sum(sharing.values())
    if total > 1.0 + 1e-9:
        out.append(
            ConfigError(
                "cluster.gpu_fraction",
                f"the pools that share one GPU take {shares} = {total:g} of it, more than the whole GPU",
                "lower the fractions so that those below 1 sum to at most 1 (e.g. main 0.5, rollout 0.5)",
            )
        )
    return out
