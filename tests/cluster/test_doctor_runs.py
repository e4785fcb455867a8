"""`quartet doctor` on the session's real Ray with several runs: a finished run is not a warning, a crashed
one is (with Ray's death cause), `--run-dir` shows that run only and reads its state record, and whole
prefixes are printed so two runs of one experiment can be told apart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import roles_for_tests
from ray import cloudpickle
from roles_for_tests import Counter

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.hostset import HostSet
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.run_record import load_ranks, mark_failed, mark_finished, mark_running, record_hosts

cloudpickle.register_pickle_by_value(roles_for_tests)
pytestmark = pytest.mark.ray

EXPERIMENT = "doctor-runs-experiment-with-a-long-name"  # long: a narrow table would have cut it


def _doctor(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "quartet.cli.main", "doctor", "--no-smoke", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


def _start(prefix: str) -> tuple[RunNames, HostSet]:
    import ray

    names = RunNames("quartet-tests", prefix, ray.get_runtime_context().gcs_address)
    pool = ResourcePool(1, 2, 0.25, use_gpu=False, timeout_s=60).create()
    return names, colocate(pool, names, counter=RoleSpec(Counter, 0))


def _wait_dead(names: RunNames, count: int) -> None:
    """Until the state API lists `count` dead actors of the run (a hang guard, far above what it takes)."""
    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        dead = [
            a
            for a in list_actors(address=address, limit=10000, raise_on_missing_output=False)
            if (a.name or "").startswith(names.prefix + ":") and a.state == "DEAD"
        ]
        if len(dead) >= count:
            return
        time.sleep(0.5)
    raise AssertionError(f"the actors of {names.prefix} were not listed dead")


def _runs(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["prefix"]: r for r in report["runs"] if r["prefix"].startswith(EXPERIMENT)}


# slow (CI time): three runs; test_doctor.py keeps a live run found from a fresh process in CI
@pytest.mark.slow
def test_doctor_tells_finished_crashed_and_live_runs_apart(ray_cluster: None) -> None:
    finished, crashed, live = (f"{EXPERIMENT}-20260101-00000{i}" for i in range(3))
    started: list[HostSet] = []
    try:
        names, hosts = _start(finished)
        hosts.health()
        hosts.shutdown()  # its own shutdown: ray.kill of every actor
        _wait_dead(names, 2)
        names, hosts = _start(crashed)
        started.append(hosts)
        pids = hosts.health()
        os.kill(pids[1], signal.SIGKILL)  # rank 1's process dies under it
        _wait_dead(names, 1)
        names, hosts = _start(live)
        started.append(hosts)
        hosts.health()

        done = _doctor("--address", names.address, "--json")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        report = json.loads(done.stdout)
        runs = _runs(report)
        assert {p: r["status"] for p, r in runs.items()} == {
            finished: "finished",
            crashed: "crashed",
            live: "live",
        }
        assert runs[crashed]["cause"].startswith("counter:1 WORKER_DIED: ")
        dead = [a for a in runs[crashed]["actors"] if a["state"] == "DEAD"]
        assert [(a["rank"], a["death_reason"]) for a in dead] == [(1, "WORKER_DIED")]
        assert {a["death_reason"] for a in runs[finished]["actors"]} == {"RAY_KILL"}
        checks = {c["name"]: c for c in report["checks"]}
        assert checks[f"run quartet-tests/{finished}"]["status"] == "ok"
        assert checks[f"run quartet-tests/{live}"]["status"] == "ok"
        assert checks[f"run quartet-tests/{crashed}"]["status"] == "warn"
        assert "WORKER_DIED" in checks[f"run quartet-tests/{crashed}"]["message"]
        probed = {p["prefix"] for p in report["probes"]}
        assert live in probed and finished not in probed and crashed not in probed  # only live runs

        text = _doctor("--address", names.address, "--no-probe", columns=80).stdout
        for prefix in (finished, crashed, live):  # whole, on one line, in a narrow terminal
            assert f"Run quartet-tests/{prefix} " in text
        assert f"warn run quartet-tests/{crashed}: crashed" in text
        assert f"ok   run quartet-tests/{finished}: finished" in text
    finally:
        for hosts in started:
            hosts.shutdown()


@pytest.mark.slow
def test_run_dir_shows_that_run_only_with_its_state_record(ray_cluster: None, tmp_path: Path) -> None:
    mine, other = f"{EXPERIMENT}-20260102-000000", f"{EXPERIMENT}-20260102-000001"
    names, hosts = _start(mine)
    _, others = _start(other)
    try:
        hosts.health()
        record_hosts(tmp_path, names, [hosts])
        mark_running(tmp_path)
        assert [(p.rank, p.node_id, p.pid) for p in load_ranks(tmp_path)["counter"]] == [
            (n["rank"], n["node_id"], n["pid"]) for n in hosts.nodes
        ]
        done = _doctor("--run-dir", str(tmp_path), "--json")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        report = json.loads(done.stdout)
        assert [r["prefix"] for r in report["runs"]] == [mine]  # the other run is not listed
        assert [p["prefix"] for p in report["probes"]] == [mine] and report["probes"][0]["ok"]
        (run,) = report["runs"]
        assert run["status"] == "live" and run["run_state"]["state"] == "running"
        assert not [c for c in report["checks"] if other in c["name"] or other in c["message"]]

        mark_finished(tmp_path)
        hosts.shutdown()
        _wait_dead(names, 2)
        report = json.loads(_doctor("--run-dir", str(tmp_path), "--json").stdout)
        checks = {c["name"]: c for c in report["checks"]}
        assert checks[f"run quartet-tests/{mine}"]["status"] == "ok"
        assert checks[f"run quartet-tests/{mine}"]["message"] == "finished: its run_state.json says finished"

        mark_failed(tmp_path, RuntimeError("reward server unreachable"))
        report = json.loads(_doctor("--run-dir", str(tmp_path), "--json").stdout)
        check = next(c for c in report["checks"] if c["name"] == f"run quartet-tests/{mine}")
        assert (
            check["status"] == "warn"
            and check["message"] == "failed: RuntimeError: reward server unreachable"
        )
    finally:
        hosts.shutdown()
        others.shutdown()
