"""`cluster.backend=local`: the same role groups and dispatch in the driver process, without Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from roles_for_tests import Counter, Doubler

from quartet.cluster.colocate import RoleSpec, live_runs
from quartet.cluster.errors import DispatchError, WorkerError
from quartet.cluster.group import Pending
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config import ConfigError
from quartet.config.cluster import Backend, ClusterConfig
from quartet.core.batch import Batch


@pytest.fixture(autouse=True)
def _restore_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local host sets RANK/WORLD_SIZE/MASTER_* in this process; put them back after each test."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "unset-by-test")


def test_local_roles_live_in_this_process_and_dispatch_like_ray() -> None:
    names = RunNames("local", "local-run")
    hosts = launch(
        ClusterConfig(backend=Backend.LOCAL),
        names,
        doubler=RoleSpec(Doubler, offset=1.0),
        counter=RoleSpec(Counter, 3),
    )
    try:
        doubler, counter = hosts.groups["doubler"], hosts.groups["counter"]
        assert hosts.backend == "local" and hosts.health() == [os.getpid()]
        assert doubler.pid() == [os.getpid()] == counter.pid()
        x = torch.arange(5.0)
        out = doubler.double(Batch({"x": x}))
        assert torch.equal(out["twice"], x * 2 + 1) and out["rank"].tolist() == [0] * 5
        assert doubler.rank_and_arg(4) == [(0, 4)] and doubler.only_zero(2) == (0, 20)
        pending = doubler.submit_batch(Doubler.double, Batch({"x": x}))
        assert isinstance(pending, Pending)
        assert torch.equal(doubler.double(pending.get())["twice"], (x * 2 + 1) * 2 + 1)
        assert counter.add(2) == [5] and counter.add(1) == [6]  # own state per role
        assert doubler.execute(lambda role, k: role.offset * k, 3) == [3.0]
        assert live_runs()[names.actor_prefix("doubler-counter")] is hosts
    finally:
        hosts.shutdown()
    assert names.actor_prefix("doubler-counter") not in live_runs()


def test_local_errors_name_role_and_keep_the_original_traceback() -> None:
    hosts = launch(ClusterConfig(backend=Backend.LOCAL), RunNames("local", "err"), doubler=RoleSpec(Doubler))
    try:
        with pytest.raises(WorkerError, match="boom from rank 0") as info:
            hosts.groups["doubler"].fail()
        assert info.value.role == "doubler" and info.value.rank == 0 and "127.0.0.1" in info.value.node
        assert isinstance(info.value.__cause__, ValueError)
        with pytest.raises(DispatchError, match="not declared with @dispatch"):
            hosts.groups["doubler"].not_declared()
    finally:
        hosts.shutdown()


def test_local_backend_needs_world_size_one() -> None:
    with pytest.raises(ConfigError, match="backend") as info:
        ClusterConfig(backend=Backend.LOCAL, bundles_per_node=2)
    assert "cluster.backend=ray" in str(info.value)


SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["ray"] = None  # as if Ray were not installed: any `import ray` now fails
    import torch
    from quartet.cluster.colocate import RoleSpec
    from quartet.cluster.dispatch import Split, dispatch
    from quartet.cluster.naming import RunNames
    from quartet.cluster.runtime import launch
    from quartet.config.cluster import ClusterConfig
    from quartet.core.batch import Batch

    class Scale:
        def __init__(self, k):
            self.k = k

        @dispatch(Split.BY_DP_RANK)
        def scale(self, batch):
            return Batch({"y": batch["x"] * self.k})

    hosts = launch(ClusterConfig(backend="local"), RunNames("ns", "p"), scale=RoleSpec(Scale, 3.0))
    out = hosts.groups["scale"].scale(Batch({"x": torch.arange(4.0)}))
    hosts.shutdown()
    print("OUT", out["y"].tolist())
    """
)


def test_local_backend_runs_where_ray_cannot_be_imported() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OUT [0.0, 3.0, 6.0, 9.0]" in done.stdout
