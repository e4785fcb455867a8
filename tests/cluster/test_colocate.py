"""Worker groups on a real local Ray: dispatch, colocation, torch.distributed, failures, shutdown."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import roles_for_tests
import torch
from ray import cloudpickle
from roles_for_tests import (
    AllReducer,
    BrokenInit,
    Counter,
    Doubler,
    SlowInit,
    TensorParallelEcho,
    TwoCollectors,
)

from quartet.cluster.colocate import HostSet, RoleSpec, colocate, live_runs
from quartet.cluster.errors import DispatchError, ResourcesUnavailableError, WorkerError
from quartet.cluster.group import Pending
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.config.cluster import PlacementStrategy
from quartet.core.batch import Batch

# The role classes live in the test folder, which Ray workers cannot import: ship them by value.
cloudpickle.register_pickle_by_value(roles_for_tests)
pytestmark = pytest.mark.ray

_counter = iter(range(1000))


def _names() -> RunNames:
    return RunNames("quartet-tests", f"test{next(_counter)}")


def _pool(world: int, cpus: float = 0.5) -> ResourcePool:
    return ResourcePool(1, world, cpus, use_gpu=False, timeout_s=30).create()


@pytest.fixture(scope="module")
def four(ray_cluster: None) -> Iterator[HostSet]:
    hosts = colocate(_pool(4), _names(), doubler=RoleSpec(Doubler, offset=1.0))
    yield hosts
    hosts.shutdown()


def test_split_pads_to_world_and_unpads_in_order(four: HostSet) -> None:
    group = four.groups["doubler"]
    x = torch.arange(10.0)
    out = group.double(Batch({"x": x}))
    assert len(out) == 10
    assert torch.equal(out["twice"], x * 2 + 1.0)
    # 10 rows padded to 12 -> 3 rows per rank; the 2 padding rows (rank 3) are removed.
    assert out["rank"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    typed = group.call_batch(Doubler.double, Batch({"x": x}))
    assert typed == out
    per_rank = group.call(Doubler.double, Batch({"x": x}))  # unjoined: one Batch per rank, padding kept
    assert [len(b) for b in per_rank] == [3, 3, 3, 3]
    assert [b["rank"].tolist() for b in per_rank] == [[r] * 3 for r in range(4)]


def test_broadcast_and_rank_zero(four: HostSet) -> None:
    group = four.groups["doubler"]
    assert group.rank_and_arg(7) == [(0, 7), (1, 7), (2, 7), (3, 7)]
    assert group.only_zero(3) == (0, 30)
    assert group.call(Doubler.rank_and_arg, 7) == [(0, 7), (1, 7), (2, 7), (3, 7)]
    assert group.call_rank_zero(Doubler.only_zero, 3) == (0, 30)


def test_typed_call_form_must_match_the_declared_split(four: HostSet) -> None:
    group = four.groups["doubler"]
    with pytest.raises(DispatchError, match=r"declared rank_zero; call it with \.call_rank_zero"):
        group.call(Doubler.only_zero, 3)
    with pytest.raises(DispatchError, match=r"declared broadcast; call it with \.call\(\)"):
        group.call_batch(Doubler.rank_and_arg, 7)  # type: ignore[arg-type]
    with pytest.raises(DispatchError, match=r"declared by_dp_rank; call it with \.call\(\)"):
        group.call_rank_zero(Doubler.double, Batch({"x": torch.arange(2.0)}))


def test_submitted_call_returns_pending_and_joins_on_get(four: HostSet) -> None:
    group = four.groups["doubler"]
    x = torch.arange(6.0)
    pending = group.submit_batch(Doubler.double, Batch({"x": x}))
    assert isinstance(pending, Pending)
    assert group.rank_and_arg(5) == [(r, 5) for r in range(4)]  # the driver went on meanwhile
    out = pending.get()
    assert torch.equal(out["twice"], x * 2 + 1) and out["rank"].tolist() == [0, 0, 1, 1, 2, 2]


def test_tensor_parallel_peers_share_a_chunk_and_only_collectors_return(ray_cluster: None) -> None:
    hosts = colocate(_pool(4, cpus=0.25), _names(), tp=RoleSpec(TensorParallelEcho, tp=2))
    try:
        group = hosts.groups["tp"]
        assert group.dp_size == 2 and [d.collect for d in group.layout] == [True, False, True, False]
        x = torch.arange(5.0)
        out = group.tag(Batch({"x": x}))  # 5 rows -> padded to 6 -> 3 rows per data-parallel rank
        assert torch.equal(out["x"], x)
        assert out["rank"].tolist() == [0, 0, 0, 2, 2]  # outputs of ranks 1 and 3 are dropped
        # Every rank ran the call on its data-parallel chunk, peers included: ask each rank directly.
        seen = group.execute(lambda role, b: role.seen(b), Batch({"x": x}).pad_to_divisor(2)[0].chunk(2)[0])
        assert seen == [[0.0, 1.0, 2.0]] * 4
        assert group.my_rank() == [0, 2]  # broadcast: the collecting ranks' outputs, in data-parallel order
        chained = group.tag(group.call_batch(TensorParallelEcho.tag, Batch({"x": x})))
        assert torch.equal(chained["x"], x)
    finally:
        hosts.shutdown()


def test_layout_without_one_collector_per_chunk_fails_at_start(ray_cluster: None) -> None:
    with pytest.raises(DispatchError, match="exactly one collecting rank"):
        colocate(_pool(2), _names(), tp=RoleSpec(TwoCollectors, tp=2))


def test_undeclared_or_missing_methods_fail_on_driver(four: HostSet) -> None:
    group = four.groups["doubler"]
    with pytest.raises(DispatchError, match="not declared with @dispatch"):
        group.not_declared()
    with pytest.raises(DispatchError, match="does not exist.*double"):
        group.dubble()
    with pytest.raises(DispatchError, match="not a @dispatch method"):
        group.call(Doubler.not_declared)


def test_remote_exception_names_role_rank_and_node(four: HostSet) -> None:
    with pytest.raises(WorkerError) as info:
        four.groups["doubler"].fail()
    err = info.value
    assert err.role == "doubler" and err.rank == 0
    assert "ValueError" in str(err) and "boom from rank 0" in str(err) and "pid" in err.node


def test_three_roles_on_two_bundles_share_two_processes(ray_cluster: None) -> None:
    hosts = colocate(
        _pool(2),
        _names(),
        doubler=RoleSpec(Doubler),
        counter=RoleSpec(Counter, 100),
        other=RoleSpec(Counter, start=5),
    )
    try:
        pids = {tuple(hosts.groups[r].pid()) for r in ("doubler", "counter", "other")}
        assert len(pids) == 1 and len(set(next(iter(pids)))) == 2  # same 2 processes for all roles
        assert hosts.groups["counter"].add(1) == [101, 101]
        assert hosts.groups["other"].add(2) == [7, 7]  # its own object, its own state
        assert hosts.groups["counter"].add(1) == [102, 102]
        counter = hosts.groups["counter"]
        del hosts  # drop every reference the test holds, then collect
        gc.collect()
        time.sleep(1.0)
        assert counter.add(1) == [103, 103]
        del counter
        gc.collect()
        time.sleep(1.0)
        (again,) = [
            h
            for h in live_runs().values()
            if "counter" in h.groups and h.groups["counter"].add(0) == [103, 103]
        ]
        assert again.groups["other"].add(0) == [7, 7]
    finally:
        for h in list(live_runs().values()):
            if "counter" in h.groups:
                h.shutdown()


def test_gloo_all_reduce_inside_actors(ray_cluster: None) -> None:
    hosts = colocate(_pool(2), _names(), reducer=RoleSpec(AllReducer))
    try:
        assert hosts.groups["reducer"].all_reduce(1.5) == [4.5, 4.5]  # 1.5*1 + 1.5*2
    finally:
        hosts.shutdown()


def _gcs() -> str:
    """The connected cluster's address: the state API refuses to guess when several Ray instances run."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


def _wait_until_dead(handle: object, timeout_s: float = 30.0) -> None:
    from ray.util.state import get_actor

    actor_id = handle._actor_id.hex()  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = get_actor(actor_id, address=_gcs())
        if state is not None and state.state == "DEAD":
            return
        time.sleep(0.1)
    raise AssertionError(f"actor {actor_id} still not dead {timeout_s:.0f} s after ray.kill")


def test_killed_actor_fails_next_call_fast(ray_cluster: None) -> None:
    import ray

    hosts = colocate(_pool(2), _names(), doubler=RoleSpec(Doubler))
    try:
        ray.kill(hosts.handles[1])
        _wait_until_dead(hosts.handles[1])  # ray.kill is asynchronous: a call sent at once may still run
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            hosts.groups["doubler"].rank_and_arg(1)
        assert time.monotonic() - start < 10
        assert info.value.role == "doubler" and info.value.rank == 1
        assert "died" in str(info.value)
    finally:
        hosts.shutdown()


def test_role_constructor_error_is_reported_and_cleaned_up(ray_cluster: None) -> None:
    from ray.util.state import list_actors

    names = _names()
    with pytest.raises(WorkerError, match="missing weights") as info:
        colocate(_pool(2), names, broken=RoleSpec(BrokenInit))
    assert info.value.role == "broken"
    time.sleep(1.0)
    alive = [
        a
        for a in list_actors(address=_gcs(), filters=[("state", "=", "ALIVE")])
        if (a.name or "").startswith(names.prefix)
    ]
    assert alive == []


def test_a_role_slower_to_start_than_its_bound_is_named_with_the_start_key(ray_cluster: None) -> None:
    # Starting is bounded by cluster.start_timeout_s, not call_timeout_s: the error names that key, the
    # silent rank, and comes at the bound (plus the 1 s poll), not at the role's 60 s
    began = time.monotonic()
    with pytest.raises(WorkerError, match=r"start\(\)|__init__\(\)") as info:
        colocate(_pool(1), _names(), start_timeout_s=3.0, slow=RoleSpec(SlowInit, 60.0))
    waited = time.monotonic() - began
    message = str(info.value)
    assert "gave no answer within 3 s (cluster.start_timeout_s)" in message, message
    assert info.value.rank == 0
    assert waited < 30.0, f"named after {waited:.1f} s"


def test_shutdown_leaves_no_actors_or_placement_groups(ray_cluster: None) -> None:
    from ray.util.state import list_actors, list_placement_groups

    names = _names()
    pool = _pool(2)
    pg_ids = {s.placement_group.id.hex() for s in pool.slots}
    hosts = colocate(pool, names, counter=RoleSpec(Counter, 0))
    assert hosts.groups["counter"].add(1) == [1, 1]
    hosts.shutdown()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [
            a
            for a in list_actors(address=_gcs(), filters=[("state", "=", "ALIVE")])
            if (a.name or "").startswith(names.prefix)
        ]
        pgs = [
            p
            for p in list_placement_groups(address=_gcs())
            if p.placement_group_id in pg_ids and p.state != "REMOVED"
        ]
        if not alive and not pgs:
            break
        time.sleep(0.2)
    assert alive == [] and pgs == []


def test_pool_too_big_fails_at_once_naming_resources(ray_cluster: None) -> None:
    start = time.monotonic()
    with pytest.raises(ResourcesUnavailableError, match="free resources by node") as info:
        ResourcePool(1, 3, 2.0, use_gpu=False).create()
    # refused up front, not after the placement wait (the pool's 60 s timeout): a busy machine may take
    # seconds to answer, never half of that
    assert time.monotonic() - start < 30
    assert "cluster.cpus_per_bundle" in str(info.value)
    with pytest.raises(ResourcesUnavailableError, match="GPU"):
        ResourcePool(1, 1, 0.5, use_gpu=True).create()


def test_spread_pool_orders_ranks(ray_cluster: None) -> None:
    pool = ResourcePool(1, 3, 0.25, use_gpu=False, strategy=PlacementStrategy.SPREAD, timeout_s=30).create()
    try:
        assert [s.rank for s in pool.slots] == [0, 1, 2]
        assert [s.bundle_index for s in pool.slots] == [0, 1, 2]
    finally:
        pool.remove()


def test_run_names_round_trip(tmp_path: Path) -> None:
    names = RunNames.new("ns", "exp", "auto")
    names.save(tmp_path)
    assert RunNames.load(tmp_path) == names
    assert names.actor_name("actor", 3) == f"{names.prefix}:actor:3"


def _settled_free_cpus(timeout_s: float = 10.0) -> int:
    """Free CPUs once Ray's view has caught up with the hosts shut down just before (it lags a moment)."""
    import ray

    deadline, last = time.monotonic() + timeout_s, -1.0
    while time.monotonic() < deadline:
        now = ray.available_resources().get("CPU", 0.0)
        if now == last:
            return int(now)
        last = now
        time.sleep(1.0)
    return int(last)


# (1, ()) is slow (CI time): (2, ()) checks the same even split of the node over bundles
@pytest.mark.parametrize(
    ("bundles", "separate"),
    [
        pytest.param(1, (), marks=pytest.mark.slow),
        (2, ()),
        (2, ("critic",)),
    ],
)
def test_auto_cpus_share_the_node_over_every_pool(
    ray_cluster: None, bundles: int, separate: tuple[str, ...]
) -> None:
    """cluster.cpus_per_bundle=0 splits the node's CPUs (4 in the test cluster) over the bundles of the main
    pool and each separate pool, capped by the CPUs free now (other tests' hosts may hold some); each worker
    gets that many bundle CPUs and torch threads (torch itself stops at the cores)."""
    import ray

    from quartet.cluster.runtime import launch
    from quartet.config.cluster import ClusterConfig

    free = _settled_free_cpus()
    expected = max(1, min(4 // (bundles * (1 + len(separate))), free // bundles))
    cfg = ClusterConfig(
        namespace="quartet-tests", bundles_per_node=bundles, cpus_per_bundle=0, separate_pools=separate
    )
    hosts = launch(cfg, _names(), doubler=RoleSpec(Doubler))
    try:
        threads = min(expected, len(os.sched_getaffinity(0)))
        assert hosts.groups["doubler"].threads() == [(str(expected), threads)] * bundles
        assert ray.available_resources().get("CPU", 0.0) == pytest.approx(free - expected * bundles)
    finally:
        hosts.shutdown()
    if not separate:
        assert expected == (
            4 // bundles if free >= 4 else expected
        )  # an idle node gives each bundle its share


def test_launch_from_config_joins_the_running_ray_in_the_run_namespace(ray_cluster: None) -> None:
    import ray

    from quartet.cluster.runtime import connect, launch
    from quartet.config.cluster import ClusterConfig

    cfg = ClusterConfig(namespace="quartet-tests", bundles_per_node=2, cpus_per_bundle=0.5)
    hosts = launch(cfg, _names(), counter=RoleSpec(Counter, 1))
    try:
        assert hosts.backend == "ray" and hosts.groups["counter"].add(1) == [2, 2]
        assert hosts.names.address == ray.get_runtime_context().gcs_address  # recorded for discovery
    finally:
        hosts.shutdown()
    with pytest.raises(RuntimeError, match="namespace 'quartet-tests', but cluster.namespace is 'other'"):
        connect(ClusterConfig(namespace="other"))
