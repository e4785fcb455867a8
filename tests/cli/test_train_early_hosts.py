"""`quartet train` joining a running Ray (the session's cluster) starts its hosts while it imports the
trainer: the run takes them, and a run that fails before its launch leaves none of them behind."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

SMALL = [
    "trainer.total_steps=1",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.export_final=false",
    "trainer.loggers=[jsonl]",
    "data.builtin_train_size=64",
    "data.train_batch_size=8",
    "actor.mini_batch_size=8",
    "model.tiny.hidden_size=64",
    "model.tiny.num_hidden_layers=2",
    "cluster.cpus_per_bundle=1",
    "cluster.namespace=quartet-tests",  # the session cluster's namespace
]


def _train(gcs: str, prefix: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "quartet.cli.main", "train", f"trainer.output_dir={tmp_path}"]
    cmd += [*SMALL, f"cluster.address={gcs}", f"cluster.run_prefix={prefix}", *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def _actors(prefix: str) -> list[str]:
    import ray

    return [a["name"] for a in ray.util.list_named_actors(True) if a["name"].startswith(prefix + ":")]


@pytest.mark.usefixtures("ray_cluster")
def test_a_joined_run_trains_on_the_hosts_it_started_early(tmp_path: Path) -> None:
    import ray

    gcs = ray.get_runtime_context().gcs_address
    out = _train(gcs, "early-cli-ok", tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (metrics,) = tmp_path.glob("*/*/metrics.jsonl")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    (startup,) = [r for r in records if r["kind"] == "startup"]
    assert startup["workers/connect_early_s"] > 0  # joined while the trainer was imported
    assert startup["workers/hosts_started_early_s"] > 0  # its hosts started then, before the launch
    assert startup["workers/hosts_prewarm_s"] > 0  # and imported the roles' modules meanwhile
    cluster = json.loads((metrics.parent / "cluster.json").read_text())
    assert cluster["prefix"] == "early-cli-ok"  # the names the early hosts were started under
    assert _actors("early-cli-ok") == []  # gone with the run


@pytest.mark.usefixtures("ray_cluster")
def test_a_run_that_fails_before_its_launch_leaves_no_host(tmp_path: Path) -> None:
    import ray

    gcs = ray.get_runtime_context().gcs_address
    missing = tmp_path / "no_such_rows.parquet"
    out = _train(gcs, "early-cli-failed", tmp_path, f"data.train_files=[{missing}]")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "no_such_rows.parquet" in out.stdout + out.stderr  # it failed preparing its data
    assert _actors("early-cli-failed") == []
    if importlib.util.find_spec("aiohttp_cors") is None:  # no dashboard: no record of dead actors
        return
    from ray.util.state import list_actors

    listed = list_actors(address=gcs, filters=[("name", "=", "early-cli-failed:rl:0")], detail=True)
    assert [a.state for a in listed] == ["DEAD"]  # it was started early, then killed by the command
