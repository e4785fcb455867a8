"""A real Ray cluster started the way users start one: `ray start --head` and a second raylet joining it.

Both raylets run on this machine in a private Ray temp folder (`RAY_TMPDIR`) with private ports, each in a
session of its own (`ray start --block`), so the test stops exactly its own processes (never `ray stop`,
which would stop every Ray on the machine). Against it:

- a plain `quartet train` (no `cluster.address`) joins it through its `ray start` record and places its
  two ranks on both nodes; while it trains, `quartet doctor` and `find_workers` in other processes find
  the run; then the second node's processes are killed and the run's error names that node and its rank;
- a run submitted with `ray job submit` joins the job's cluster (Ray sets `RAY_ADDRESS` for the job).

A second cluster, one head started with token authentication off (`RAY_AUTH_MODE=disabled`), is joined
the way a plain run joins (its `ray start` record) by a process whose HOME holds a Ray token file: the join
follows the cluster's mode and its actor runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
TRAIN = [
    "data.train_batch_size=4",
    "data.builtin_train_size=16",
    "data.builtin_val_size=8",
    "data.max_response_length=4",
    "rollout.n=2",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size_per_device=4",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "trainer.save_freq=0",
    "trainer.export_final=false",
]
COMMON = ["--num-cpus=2", "--disable-usage-stats", "--block"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    """Every process of the session `sid` (what one `ray start --block` started, workers included)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    out.append(int(entry))
            except OSError:
                continue
    return out


def kill_session(sid: int) -> None:
    for pid in session_pids(sid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue


@dataclass
class StartedCluster:
    tmp: Path
    gcs: str
    dashboard: str
    head: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes]

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process on this machine that sees this cluster's `ray start` record."""
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(RAY_TMPDIR=str(self.tmp), **extra)
        return env


def wait_for(check: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1.0)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def alive_nodes(cluster_env: dict[str, str], gcs: str) -> int:
    done = subprocess.run(
        [str(BIN / "ray"), "status", "--address", gcs],
        env={**cluster_env, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    active = done.stdout.split("Pending:")[0]
    return active.count(" node_")


def start_head(tmp: Path, env: dict[str, str], *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """`ray start --head --block` in a session of its own, with Ray's temp folder `tmp` (its `ray start`
    record included) and private ports; the process and the GCS address it recorded."""
    logs = tmp / "logs"
    logs.mkdir()
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            f"--port={free_port()}",
            f"--ray-client-server-port={free_port()}",
        ]
        + [f"--dashboard-agent-listen-port={free_port()}", *COMMON, *flags],
        env=env,
        stdout=(logs / "head.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        record = tmp / "ray" / "ray_current_cluster"
        wait_for(
            lambda: record.exists() and record.read_text().strip(), 240, "the head's ray_current_cluster"
        )
    except BaseException:
        stop(head, tmp)
        raise
    return head, record.read_text().strip()


def stop(proc: subprocess.Popen[bytes] | None, tmp: Path | None = None) -> None:
    """Kill every process of `proc`'s session (never `ray stop`: other Rays may run here) and remove `tmp`."""
    if proc is not None:
        kill_session(proc.pid)
        proc.wait(timeout=30)
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def started_cluster() -> Iterator[StartedCluster]:
    tmp = Path(tempfile.mkdtemp(prefix="qrs", dir="/tmp"))  # short: Ray's socket paths live under it
    dash = free_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=str(tmp), RAY_AUTH_MODE="token")
    head, gcs = start_head(tmp, env, "--include-dashboard=true", f"--dashboard-port={dash}")
    worker: subprocess.Popen[bytes] | None = None
    try:
        worker = subprocess.Popen(
            [str(BIN / "ray"), "start", f"--address={gcs}", f"--dashboard-agent-listen-port={free_port()}"]
            + COMMON,
            env=env,
            stdout=(tmp / "logs" / "worker.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: alive_nodes(env, gcs) == 2, 240, "two alive nodes in `ray status`")
        yield StartedCluster(tmp, gcs, f"http://127.0.0.1:{dash}", head, worker)
    finally:
        stop(worker)
        stop(head, tmp)


FIND = textwrap.dedent(
    """
    import json, sys, ray
    from quartet.cluster.discovery import find_workers
    handles = find_workers(sys.argv[1], sys.argv[2], sys.argv[3], 2, timeout_s=60)
    print("PIDS " + json.dumps(ray.get([h.ping.remote() for h in handles], timeout=60)))
    """
)


@pytest.mark.slow
def test_a_plain_run_joins_the_ray_start_cluster_spans_both_nodes_and_names_a_lost_node(
    started_cluster: StartedCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    c = started_cluster
    run_dir = tmp_path / "quartet" / "twonode"
    driver = subprocess.Popen(
        [str(BIN / "quartet"), "train", f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
        + ["trainer.experiment_name=twonode", "trainer.total_steps=500", "cluster.nodes=2", *TRAIN],
        env=c.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        metrics = run_dir / "metrics.jsonl"

        def steps_done() -> int:
            if driver.poll() is not None:
                early = driver.stdout.read() if driver.stdout else ""
                raise AssertionError(f"the run ended early ({driver.returncode}):\n{early}")
            if not metrics.exists():
                return 0
            return sum('"kind": "step"' in line for line in metrics.read_text().splitlines())

        wait_for(lambda: steps_done() >= 3, 420, "3 steps of the run")  # 3 steps across both nodes
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        joined = next(r for r in records if r.get("kind") == "cluster")
        assert joined["ray"].startswith("joined the Ray cluster at " + c.gcs)
        assert "the `ray start` cluster on this machine" in joined["ray"]
        located = json.loads((run_dir / "cluster.json").read_text())
        ranks = located["ranks"]["rl"]
        assert len({r["node_id"] for r in ranks}) == 2  # one rank on each node
        prefix = located["prefix"]

        # other processes find the live run: quartet doctor (with its discovery probe) and find_workers
        doctor = subprocess.run(
            [str(BIN / "quartet"), "doctor", "--address", c.gcs, "--run-dir", str(run_dir)]
            + ["--json", "--no-smoke", "--probe-timeout", "60"],
            env=c.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        report = json.loads(doctor.stdout)
        (run,) = report["runs"]  # --run-dir: only this run
        assert run["prefix"] == prefix and run["status"] == "live"
        assert len([n for n in report["nodes"] if n["alive"]]) == 2
        (probe,) = report["probes"]
        assert probe["ok"] and sorted(probe["pids"]) == sorted(r["pid"] for r in ranks)
        found = subprocess.run(
            [sys.executable, "-c", FIND, c.gcs, located["namespace"], f"{prefix}:rl"],
            env=c.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        line = next(x for x in found.stdout.splitlines() if x.startswith("PIDS "))
        assert sorted(json.loads(line.removeprefix("PIDS "))) == sorted(r["pid"] for r in ranks)

        # the second node is lost: every process of its `ray start` session, the rank's worker included
        lost = [r for r in ranks if r["pid"] in session_pids(c.worker.pid)]
        assert len(lost) == 1, (ranks, session_pids(c.worker.pid))
        kill_session(c.worker.pid)
        output, _ = driver.communicate(timeout=300)
    finally:
        if driver.poll() is None:
            kill_session(driver.pid)
            driver.wait(timeout=30)
    assert driver.returncode != 0
    failure = next(x for x in output.splitlines() if x.startswith("run failed:"))
    # the lost node and its rank come first, the survivor's connection error after
    node_id = lost[0]["node_id"]
    assert f"rank {lost[0]['rank']} on node" in failure.split(";")[0], failure
    assert f"lost node {lost[0]['ip']} (node {node_id[:8]})" in failure, failure
    state = json.loads((run_dir / "run_state.json").read_text())
    assert state["state"] == "failed" and "lost node" in state["error"]


@pytest.mark.slow
def test_a_run_submitted_as_a_ray_job_joins_the_jobs_cluster(
    started_cluster: StartedCluster, tiny_model_dir: Path, tmp_path: Path
) -> None:
    c = started_cluster
    train = [str(BIN / "quartet"), "train", f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
    train += ["trainer.experiment_name=job", "trainer.total_steps=1", *TRAIN]
    done = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", c.dashboard, "--", *train],
        env=c.env(RAY_AUTH_MODE="token"),
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [
        json.loads(x) for x in (tmp_path / "quartet" / "job" / "metrics.jsonl").read_text().splitlines()
    ]
    joined = next(r for r in records if r.get("kind") == "cluster")
    assert "RAY_ADDRESS is set (as inside `ray job submit`)" in joined["ray"]
    assert sum(r.get("kind") == "step" for r in records) == 1


CONNECT = textwrap.dedent(
    """
    from quartet.cluster.runtime import connect, connection
    from quartet.config.cluster import ClusterConfig
    address = connect(ClusterConfig(num_cpus=2, namespace="ray-address-test"))  # a local-Ray-only setting
    print("CONNECTED " + address + " | " + connection())
    """
)


@pytest.mark.slow
def test_ray_address_set_by_the_user_is_joined_without_local_ray_arguments(
    started_cluster: StartedCluster, tmp_path: Path
) -> None:
    """RAY_ADDRESS alone (no `ray start` record visible): joined, and `cluster.num_cpus` is ignored with a
    warning instead of Ray's "num_cpus and num_gpus must not be provided"."""
    c = started_cluster
    env = {**c.env(), "RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": c.gcs}  # an empty temp dir: no record
    argv = [sys.executable, "-c", CONNECT]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    line = next((x for x in done.stdout.splitlines() if x.startswith("CONNECTED ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-3000:]
    assert line.startswith(f"CONNECTED {c.gcs} | joined the Ray cluster at {c.gcs}")
    assert "RAY_ADDRESS is set" in line
    assert "cluster.num_cpus=2 applies to a local Ray this run starts; ignored" in done.stderr


@pytest.fixture(scope="module")
def cluster_without_auth() -> Iterator[tuple[Path, str]]:
    """A `ray start --head` cluster with token authentication off (`RAY_AUTH_MODE=disabled`, as many
    existing clusters run): its Ray temp folder and GCS address. One raylet is enough: an actor on the head
    already died when the driver turned token authentication on."""
    tmp = Path(tempfile.mkdtemp(prefix="qra", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_TMPDIR=str(tmp), RAY_AUTH_MODE="disabled")
    head, gcs = start_head(tmp, env, "--include-dashboard=false")
    try:
        yield tmp, gcs
    finally:
        stop(head, tmp)


JOIN_AND_CALL = textwrap.dedent(
    """
    import os, ray
    from quartet.cluster.runtime import connect, connection
    from quartet.config.cluster import ClusterConfig
    connect(ClusterConfig(namespace="no-auth-test"))  # as `quartet train`: the `ray start` record
    print("CONNECTED " + connection())
    Echo = ray.remote(num_cpus=0)(type("Echo", (), {"pid": lambda self: os.getpid()}))
    print("ACTOR " + str(ray.get(Echo.remote().pid.remote(), timeout=120)))
    """
)


def test_a_run_joins_a_cluster_without_token_auth_despite_a_token_file(
    cluster_without_auth: tuple[Path, str], tmp_path: Path
) -> None:
    """A token file in ~/.ray (left by any earlier local run) made the driver turn token authentication
    on, and every actor of the run died before it started; the driver now follows the cluster. An explicit
    RAY_AUTH_MODE=token against it is named at once, with the fix."""
    tmp, gcs = cluster_without_auth
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
    env = {**clean, "HOME": str(tmp_path), "RAY_TMPDIR": str(tmp)}
    argv = [sys.executable, "-c", JOIN_AND_CALL]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr[-3000:]
    assert f"CONNECTED joined the Ray cluster at {gcs}" in done.stdout, out
    assert "token authentication off" in done.stdout and "\nACTOR " in done.stdout, out

    forced = subprocess.run(
        argv, env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=120
    )
    assert forced.returncode != 0 and "ACTOR" not in forced.stdout
    refused = f"the Ray cluster at '{gcs}' runs without token authentication, but this process has "
    assert refused + "RAY_AUTH_MODE=token" in forced.stderr, forced.stderr[-3000:]
    assert "set RAY_AUTH_MODE=disabled" in forced.stderr
