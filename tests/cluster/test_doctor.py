"""`quartet doctor` against the session's real Ray with a running colocated run, and with no cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import roles_for_tests
from ray import cloudpickle
from roles_for_tests import Counter

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool

cloudpickle.register_pickle_by_value(roles_for_tests)


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "quartet.cli.main", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


@pytest.mark.ray
def test_doctor_lists_the_run_and_discovers_it_from_a_fresh_process(
    ray_cluster: None, tmp_path: Path
) -> None:
    import ray

    names = RunNames("quartet-tests", "doctor-run", ray.get_runtime_context().gcs_address)
    hosts = colocate(
        ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=30).create(), names, counter=RoleSpec(Counter, 0)
    )
    try:
        pids = hosts.health()
        done = _doctor("--address", names.address, "--json", "--no-smoke")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        facts = json.loads(done.stdout)
        checks = {c["name"]: c for c in facts["checks"]}
        assert (
            checks["ray"]["status"] == "ok" and checks["discovery quartet-tests/doctor-run"]["status"] == "ok"
        )
        assert all(c["status"] != "fail" for c in facts["checks"]) and facts["smoke"] is None
        (run,) = [r for r in facts["runs"] if r["prefix"] == "doctor-run"]
        assert run["namespace"] == "quartet-tests"
        alive = [a for a in run["actors"] if a["state"] == "ALIVE"]
        assert [(a["label"], a["rank"], a["pid"]) for a in alive] == [
            ("counter", 0, pids[0]),
            ("counter", 1, pids[1]),
        ]
        (probe,) = [p for p in facts["probes"] if p["prefix"] == "doctor-run"]
        assert probe["ok"] and probe["pids"] == pids
        assert sum(n["cpus"] for n in facts["nodes"] if n["alive"]) == 4  # the session cluster's num_cpus

        names.save(tmp_path)  # the run folder records where its workers are
        text = _doctor("--run-dir", str(tmp_path), "--device", "cpu", "--smoke-timeout", "120")
        assert text.returncode == 0, text.stdout[-3000:]
        assert "doctor-run" in text.stdout and "counter:1" in text.stdout and "ALIVE" in text.stdout
        assert "discovery ok" in text.stdout and "2/2 workers" in text.stdout
        assert "Smoke tiny Qwen2 on cpu passed" in text.stdout and "\n0 failed," in text.stdout
    finally:
        hosts.shutdown()


def test_doctor_without_a_cluster_says_so_and_how_to_fix() -> None:
    done = _doctor("--address", "127.0.0.1:1")
    assert done.returncode == 2
    assert "No Ray cluster at '127.0.0.1:1'" in done.stdout and "nothing is listening" in done.stdout
    assert "ray start --head" in done.stdout and "torch" in done.stdout
    assert "FAIL ray: no Ray cluster at '127.0.0.1:1'" in done.stdout
    assert "fix: start one with `ray start --head`" in done.stdout and "cluster.backend=local" in done.stdout


@pytest.mark.ray
def test_doctor_fails_with_exit_1_and_a_fix_when_a_check_other_than_ray_fails(ray_cluster: None) -> None:
    import ray

    done = _doctor(
        "--address", ray.get_runtime_context().gcs_address, "--no-probe", "--smoke-timeout", "0.01"
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert (
        "FAIL smoke" in done.stdout and "fix: on a busy machine retry with --smoke-timeout 60" in done.stdout
    )
    assert "ok   ray: cluster at" in done.stdout and "1 failed," in done.stdout


def test_doctor_json_without_a_cluster_lists_checks_and_device_facts() -> None:
    import torch

    done = _doctor("--address", "127.0.0.1:1", "--no-smoke", "--json")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    facts = json.loads(done.stdout)
    assert facts["address"] == "127.0.0.1:1" and "nothing is listening" in facts["error"]
    assert "torch" in facts["versions"] and facts["smoke"] is None
    assert {c["status"] for c in facts["checks"]} <= {"ok", "warn", "fail"}
    (ray_check,) = [c for c in facts["checks"] if c["name"] == "ray"]
    assert ray_check["status"] == "fail" and "127.0.0.1:1" in ray_check["message"]
    assert "ray start --head" in ray_check["fix"] and "cluster.backend=local" in ray_check["fix"]
    assert [c["name"] for c in facts["checks"] if c["status"] == "fail"] == ["ray"]
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_total = int(next(x for x in meminfo if x.startswith("MemTotal:")).split()[1]) * 1024
    assert facts["host"]["mem_total_bytes"] == mem_total and facts["host"]["cpus"] == os.cpu_count()
    cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert len(facts["cuda"]["devices"]) == cuda
    assert facts["device"] == ("cuda" if cuda else "cpu")
