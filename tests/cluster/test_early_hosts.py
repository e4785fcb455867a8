"""Hosts started before the launch (`quartet.cluster.early_hosts`): the launch of the same run takes them
(same processes, the prewarmed modules already imported), any other launch or the command's end discards
them, and a failure to start them early leaves nothing behind."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import roles_for_tests
from ray import cloudpickle
from roles_for_tests import ProcessFacts

from quartet.cluster.colocate import RoleSpec
from quartet.cluster.early_hosts import (
    MAIN_LABEL,
    discard_early_hosts,
    early_names,
    start_early_hosts,
    take_early_hosts,
)
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config.cluster import MAIN_POOL, Backend, ClusterConfig
from quartet.config.roles import Role

cloudpickle.register_pickle_by_value(roles_for_tests)
pytestmark = pytest.mark.ray

# colorsys: a standard module that neither Ray's worker nor quartet's host imports by itself
PREWARMED = "colorsys"
_counter = iter(range(1000))


def _cluster(**kw: object) -> ClusterConfig:
    """Two bundles of one CPU on the session's Ray (4 CPUs)."""
    return ClusterConfig(namespace="quartet-tests", bundles_per_node=2, cpus_per_bundle=1, **kw)  # type: ignore[arg-type]


def _names() -> RunNames:
    return RunNames("quartet-tests", f"early{next(_counter)}")


def _alive(handles: list[object]) -> list[bool]:
    import ray

    out = []
    for handle in handles:
        try:
            ray.get(handle.ping.remote(), timeout=30)  # type: ignore[attr-defined]
            out.append(True)
        except ray.exceptions.RayActorError:
            out.append(False)
    return out


def _named(names: RunNames) -> list[str]:
    import ray

    prefix = names.actor_prefix(MAIN_LABEL)
    return sorted(a["name"] for a in ray.util.list_named_actors(True) if a["name"].startswith(prefix))


@pytest.fixture
def clean(ray_cluster: None) -> Iterator[None]:
    yield
    discard_early_hosts()


@pytest.mark.usefixtures("clean")
def test_the_launch_of_the_same_run_takes_the_early_hosts_with_their_imports_done() -> None:
    cluster, names = _cluster(), _names()
    early = start_early_hosts(cluster, names, [PREWARMED, "quartet_no_such_module_q"])
    assert early is not None and early_names(cluster) == names
    assert _named(names) == [f"{names.prefix}:{MAIN_LABEL}:0", f"{names.prefix}:{MAIN_LABEL}:1"]
    hosts = launch(cluster, names, MAIN_LABEL, 1, MAIN_POOL, facts=RoleSpec(ProcessFacts))
    try:
        assert hosts.handles == early.handles  # the same actors: no host was started at the launch
        facts = hosts.groups["facts"].facts(PREWARMED)
        assert [f[2] for f in facts] == [True, True]  # imported by the prewarm, before any role
        assert [f[1] for f in facts] == [1, 1]  # torch's threads: the bundle's CPUs, set by the host
        assert len({f[0] for f in facts}) == 2  # one process per bundle
        timing = hosts.timing
        assert timing["hosts_started_early"] >= 0.0 and timing["hosts_prewarm"] > 0.0
        assert early_names(cluster) is None  # taken: a later run gets fresh names
    finally:
        hosts.shutdown()
    assert _alive(early.handles) == [False, False]


@pytest.mark.usefixtures("clean")
def test_a_launch_of_another_run_discards_them_and_starts_its_own() -> None:
    cluster, names = _cluster(), _names()
    early = start_early_hosts(cluster, names, [PREWARMED])
    assert early is not None
    other = _names()
    hosts = launch(cluster, other, MAIN_LABEL, 1, MAIN_POOL, facts=RoleSpec(ProcessFacts))
    try:
        assert hosts.handles != early.handles and "hosts_started_early" not in hosts.timing
        assert _alive(early.handles) == [False, False] and _named(names) == []
    finally:
        hosts.shutdown()


@pytest.mark.usefixtures("clean")
def test_a_changed_config_is_not_taken() -> None:
    names = _names()
    early = start_early_hosts(_cluster(), names, [PREWARMED])
    assert early is not None
    assert take_early_hosts(_cluster(call_timeout_s=99.0), names, MAIN_LABEL, 1, MAIN_POOL) is None
    assert _alive(early.handles) == [False, False]


@pytest.mark.usefixtures("clean")
def test_discarding_kills_them_and_frees_their_bundles() -> None:
    import ray

    before = ray.available_resources().get("CPU", 0.0)
    names = _names()
    early = start_early_hosts(_cluster(), names, [PREWARMED])
    assert early is not None
    assert discard_early_hosts() == 2 and discard_early_hosts() == 0
    assert _alive(early.handles) == [False, False] and early_names(_cluster()) is None
    deadline = time.monotonic() + 30  # Ray's view of free resources lags a moment behind the release
    while ray.available_resources().get("CPU", 0.0) < before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0.0) >= before


@pytest.mark.usefixtures("clean")
def test_what_cannot_start_early_starts_nothing() -> None:
    import ray

    too_big = ClusterConfig(namespace="quartet-tests", bundles_per_node=1, cpus_per_bundle=64)
    began = time.monotonic()
    assert start_early_hosts(too_big, _names(), [PREWARMED]) is None  # the launch explains it later
    assert time.monotonic() - began < 15
    local = ClusterConfig(namespace="quartet-tests", backend=Backend.LOCAL)
    assert start_early_hosts(local, _names(), [PREWARMED]) is None
    separate = _cluster(separate_pools=(Role.ROLLOUT,))
    assert start_early_hosts(separate, _names(), [PREWARMED]) is None
    assert early_names(too_big) is None
    assert not [a for a in ray.util.list_named_actors(True) if a["name"].startswith("early")]


@pytest.mark.usefixtures("clean")
def test_a_rank_that_cannot_start_leaves_none_of_its_siblings_behind() -> None:
    """Rank 1's name is taken by a live actor: rank 0, already started, is killed and the pool released;
    the launch then meets the same name and explains it."""
    import ray

    names = _names()
    squatter = ray.remote(ProcessFacts).options(name=names.actor_name(MAIN_LABEL, 1)).remote()
    try:
        ray.get(squatter.__ray_ready__.remote(), timeout=60)
        before = ray.available_resources().get("CPU", 0.0)
        assert start_early_hosts(_cluster(), names, [PREWARMED]) is None
        deadline = time.monotonic() + 30  # a kill and a release reach Ray's tables a moment later
        while time.monotonic() < deadline and (
            len(_named(names)) > 1 or ray.available_resources().get("CPU", 0.0) < before
        ):
            time.sleep(0.2)
        assert _named(names) == [names.actor_name(MAIN_LABEL, 1)]  # only the squatter
        assert ray.available_resources().get("CPU", 0.0) >= before  # the early pool was released
    finally:
        ray.kill(squatter)
