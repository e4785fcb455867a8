"""The run folder's record (`quartet.cluster.run_record`) and the doctor's judgement of built facts: run
status from actor deaths and the state record, dead-node warnings. No Ray needed."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

from quartet.cli.doctor_checks import dead_node_checks, run_checks
from quartet.cluster.naming import RunNames
from quartet.cluster.run_record import (
    RankPlace,
    RunState,
    load_ranks,
    load_run_state,
    mark_failed,
    mark_finished,
    mark_running,
    record_hosts,
)
from quartet.cluster.survey import ActorFacts, NodeFacts, RunFacts, classify_run, death_of


def test_cluster_json_records_each_rank_and_old_files_still_load(tmp_path: Path) -> None:
    names = RunNames("ns", "exp-20260101-000000", "10.0.0.1:6379")
    hosts = [
        SimpleNamespace(
            label="rl", nodes=[{"rank": 0, "node_id": "n1", "ip": "10.0.0.1", "pid": 11, "name": "x"}]
        ),
        SimpleNamespace(label="critic", nodes=[{"rank": 0, "node_id": "n2", "ip": "10.0.0.2", "pid": 22}]),
    ]
    record_hosts(tmp_path, names, hosts)
    assert RunNames.load(tmp_path) == names
    assert load_ranks(tmp_path) == {
        "rl": [RankPlace(0, "n1", "10.0.0.1", 11)],
        "critic": [RankPlace(0, "n2", "10.0.0.2", 22)],
    }
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # the temporary file was renamed
    old = tmp_path / "old"
    old.mkdir()
    (old / "cluster.json").write_text(json.dumps({"namespace": "ns", "prefix": "p"}))  # before ranks/address
    assert RunNames.load(old) == RunNames("ns", "p") and load_ranks(old) == {}


def test_run_state_goes_running_then_finished_or_failed(tmp_path: Path) -> None:
    assert load_run_state(tmp_path) is None
    started = mark_running(tmp_path)
    state = load_run_state(tmp_path)
    assert state == started and state.state == "running" and state.driver_pid == os.getpid()
    assert state.hostname == socket.gethostname() and state.ended_at is None and state.driver_alive() is True
    done = mark_finished(tmp_path)
    assert done.state == "finished" and done.started_at == started.started_at and done.ended_at is not None
    try:
        raise ValueError("bad value\nsecond line")
    except ValueError as err:
        failed = mark_failed(tmp_path, err)
    assert load_run_state(tmp_path) == failed and failed.error == "ValueError: bad value"


def _actor(rank: int, state: str = "ALIVE", reason: str = "", node: str = "n1") -> ActorFacts:
    return ActorFacts(
        f"p:rl:{rank}", "rl", rank, state, 100 + rank, node, reason, f"{reason} text" if reason else ""
    )


def test_classify_run_tells_live_finished_failed_and_crashed_apart() -> None:
    run = RunFacts("ns", "p", [_actor(0), _actor(1)])
    assert classify_run(run) == ("live", "")
    run.actors = [_actor(0, "DEAD", "RAY_KILL"), _actor(1, "DEAD", "RAY_KILL")]
    assert classify_run(run) == ("finished", "")  # its shutdown killed them
    run.actors = [_actor(0, "DEAD", "RAY_KILL"), _actor(1, "DEAD", "WORKER_DIED")]
    assert classify_run(run) == ("crashed", "rl:1 WORKER_DIED: WORKER_DIED text")
    run.actors = [_actor(0), _actor(1, "DEAD", "RAY_KILL")]  # one rank killed from outside
    assert classify_run(run) == ("crashed", "rl:1 killed by ray.kill while the other ranks live")
    run.actors = [_actor(0, "DEAD", "OWNER_DIED"), _actor(0)]  # relaunched under the same name
    assert classify_run(run) == ("live", "")
    me = socket.gethostname()
    running = RunState("running", os.getpid(), me, 0.0)
    run.actors = [_actor(0, "DEAD", "RAY_KILL")]
    assert classify_run(run, running)[0] == "crashed"  # killed while the driver says it runs
    gone = RunState("running", 2**22 + 12345, me, 0.0)  # above Linux's pid_max default: no such process
    assert classify_run(RunFacts("ns", "p"), gone) == (
        "crashed",
        f"the driver (pid {2**22 + 12345} on {me}) is gone",
    )
    failed = RunState("failed", 1, me, 0.0, 1.0, "RuntimeError: boom")
    assert classify_run(run, failed) == ("failed", "RuntimeError: boom")
    assert classify_run(run, RunState("finished", 1, me, 0.0, 1.0)) == ("finished", "")


def test_run_checks_warn_on_failed_and_crashed_only() -> None:
    runs = [
        RunFacts("ns", p, [_actor(0)], status=s, cause=c)
        for p, s, c in [
            ("a", "live", ""),
            ("b", "finished", ""),
            ("c", "failed", "RuntimeError: x"),
            ("d", "crashed", "rl:0 NODE_DIED: y"),
        ]
    ]
    checks = {c.name: c for c in run_checks(runs)}
    assert [checks[f"run ns/{p}"].status for p in "abcd"] == ["ok", "ok", "warn", "warn"]
    assert checks["run ns/c"].message == "failed: RuntimeError: x"
    assert checks["run ns/d"].message == "crashed (1 of 1 actors alive): rl:0 NODE_DIED: y"


def test_dead_node_check_names_the_node_and_the_ranks_there() -> None:
    nodes = [
        NodeFacts("alive-node", "10.0.0.1", True, 4, 0, 8, 4, 0),
        NodeFacts("dead-node-0123456789", "10.0.0.2", False, 4, 0, 8, 0, 0),
    ]
    run = RunFacts(
        "ns",
        "exp-20260101-000000",
        [_actor(0, node="alive-node"), _actor(1, "DEAD", "NODE_DIED", "dead-node-0123456789")],
    )
    (check,) = dead_node_checks(nodes, [run])
    assert check.status == "warn" and check.name == "node dead-node-0123456789"
    assert (
        check.message == "node dead-node-0123456789 (10.0.0.2) is dead; ranks there: exp-20260101-000000 rl:1"
    )
    recorded = {"critic": [RankPlace(0, "dead-node-0123456789", "10.0.0.2", 7)]}  # no actor listed any more
    (check,) = dead_node_checks(nodes, [RunFacts("ns", "exp-1")], recorded)
    assert check.message.endswith("ranks there: exp-1 critic:0")
    assert dead_node_checks(nodes[:1], [run]) == []


def test_death_of_reads_the_state_api_death_cause() -> None:
    cause = {"actor_died_error_context": {"reason": "RAY_KILL", "error_message": "killed by\n `ray.kill`."}}
    assert death_of(cause) == ("RAY_KILL", "killed by `ray.kill`.")
    assert death_of({"creation_task_failure_context": {"formatted_exception_string": "x"}}) == (
        "CREATION_TASK_FAILURE",
        "",
    )
    assert death_of(None) == ("", "")
