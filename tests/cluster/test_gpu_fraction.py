"""Pools on fractions of one GPU: the bundles and the host actors' Ray options carry each pool's share;
on a CUDA machine two such hosts both see the one device as cuda:0."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
import torch
from ray import cloudpickle

from quartet.cluster.colocate import RoleSpec, colocate, host_options
from quartet.cluster.dispatch import Split, dispatch
from quartet.cluster.host_actors import host_threads
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import BundleSlot, ResourcePool
from quartet.config import load_config
from quartet.config.cluster import ClusterConfig

ASYNC = "examples/single_gpu/async.yaml"


def _slot() -> BundleSlot:
    return BundleSlot(rank=0, placement_group=None, bundle_index=0, node_id="n0", node_ip="10.0.0.1")


@pytest.mark.parametrize(("pool", "share"), [("main", 0.5), ("rollout", 0.5)])
def test_each_pool_of_the_one_gpu_example_asks_ray_for_its_share(pool: str, share: float) -> None:
    cluster = load_config(ASYNC).cluster
    planned = ResourcePool.planned(cluster, pool, use_gpu=True)
    assert planned.bundle() == {"CPU": cluster.cpus_per_bundle, "GPU": share}
    options = host_options(planned, _slot(), "run:rl:0", "quartet", max_concurrency=5)
    assert options["num_gpus"] == share and options["num_cpus"] == cluster.cpus_per_bundle
    assert options["max_concurrency"] == 5 and options["name"] == "run:rl:0"
    assert options["scheduling_strategy"].placement_group_bundle_index == 0
    # torch's threads are the bundle's CPUs, set by the host itself: a runtime_env would cost a fresh process
    assert "runtime_env" not in options and host_threads(planned) == max(1, int(cluster.cpus_per_bundle))


def test_a_whole_gpu_by_default_and_none_on_cpu() -> None:
    cluster = ClusterConfig(cpus_per_bundle=2)
    gpu = ResourcePool.planned(cluster, "main", use_gpu=True)
    assert gpu.bundle() == {"CPU": 2, "GPU": 1.0}
    assert host_options(gpu, _slot(), "a", "ns")["num_gpus"] == 1.0
    cpu = ResourcePool.planned(cluster, "main", use_gpu=False)
    assert cpu.bundle() == {"CPU": 2} and host_options(cpu, _slot(), "a", "ns")["num_gpus"] == 0


class DeviceProbe:
    """What a host process sees of CUDA."""

    @dispatch(Split.BROADCAST)
    def facts(self) -> dict[str, object]:
        device = torch.device("cuda", 0)
        return {
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "count": torch.cuda.device_count(),
            "uuid": str(torch.cuda.get_device_properties(device).uuid),
        }


@pytest.fixture
def shared_hosts(ray_cluster: None) -> Iterator[list[dict[str, object]]]:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]  # tests/ is not importable there
    cluster = load_config(ASYNC, ["cluster.cpus_per_bundle=1"]).cluster
    hosts = []
    try:
        for pool in ("main", "rollout"):
            resources = ResourcePool.from_config(cluster, pool)
            names = RunNames("quartet-tests", f"share-{pool}")
            hosts.append(colocate(resources, names, probe=RoleSpec(DeviceProbe)))
        yield [h.groups["probe"].call(DeviceProbe.facts)[0] for h in hosts]
    finally:
        for h in hosts:
            h.shutdown()


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_two_pools_on_half_a_gpu_each_see_the_same_device_as_cuda_0(
    shared_hosts: list[dict[str, object]],
) -> None:
    main, rollout = shared_hosts
    assert main["count"] == rollout["count"] == 1  # Ray names the one shared GPU, it does not hide it
    assert main["visible"] == rollout["visible"] and main["visible"]
    assert main["uuid"] == rollout["uuid"]
