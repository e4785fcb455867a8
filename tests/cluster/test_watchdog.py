"""The hang watchdog: a rank alive but stuck is named within its phase's deadline, with every rank's stacks.

Both tests would otherwise wait `cluster.call_timeout_s` (an hour) or gloo's own 30-minute timeout; the
elapsed-time bounds are hang guards, far above what the watchdog takes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import roles_for_tests
from ray import cloudpickle
from roles_for_tests import AllReducer, Stalling

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.errors import WorkerError
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.stopped_stacks import process_state, py_spy_stacks
from quartet.cluster.watchdog import HangError, collect_stacks
from quartet.trainer.records.phase_timer import PhaseDeadlines, PhaseTimer

# The role classes live in the test folder, which Ray workers cannot import: ship them by value.
cloudpickle.register_pickle_by_value(roles_for_tests)
pytestmark = pytest.mark.ray

DEADLINE_S = 5.0
HANG_GUARD_S = 120.0


def _pool(world: int) -> ResourcePool:
    return ResourcePool(1, world, 0.5, use_gpu=False, timeout_s=30).create()


def _timer(run_dir: Path, step: int) -> PhaseTimer:
    return PhaseTimer(guard=PhaseDeadlines(DEADLINE_S, 3600.0, run_dir).guard(step))


# slow (CI time): the watchdog naming a blocked rank stays in CI (test_rank_blocked_in_a_collective...)
@pytest.mark.slow
def test_rank_stuck_in_update_is_named_with_its_stack(ray_cluster: None, tmp_path: Path) -> None:
    hosts = colocate(_pool(2), RunNames.new("quartet-tests", "hang"), stalling=RoleSpec(Stalling))
    try:
        start = time.monotonic()
        with pytest.raises(HangError) as caught, _timer(tmp_path, 7)("update_actor"):
            hosts.groups["stalling"].call(Stalling.update, 1)
        assert time.monotonic() - start < HANG_GUARD_S
        # the path for ranks on another node than the driver's: a Ray task pinned to the rank's node
        through_tasks = collect_stacks(hosts.nodes, here=None)
        assert sorted(through_tasks) == [0, 1] and " in update" in through_tasks[1]
    finally:
        hosts.shutdown()
    message = str(caught.value)
    assert "phase 'update_actor' of step 7" in message and "silent ranks [1]" in message
    assert "rank 1: roles_for_tests.py:" in message and " update on " in message  # the frame that sleeps
    assert caught.value.silent == [1] and caught.value.stacks_file == tmp_path / "hang_7.txt"
    stacks = (tmp_path / "hang_7.txt").read_text()
    assert "## rank 0 (answered)" in stacks and "## rank 1 (SILENT)" in stacks
    assert stacks.count("most recent call first") >= 2  # a stack dumped from each rank
    assert 'roles_for_tests.py", line' in stacks.split("## rank 1")[1]


# slow (a pool on Ray): the py-spy reader against a stopped process stays in CI (test_stopped_stacks.py)
@pytest.mark.slow
def test_a_stopped_rank_is_read_by_py_spy_here_and_through_its_node(
    ray_cluster: None, tmp_path: Path
) -> None:
    """Rank 1 is stopped inside `update`: the error names its state and frame, and a Ray task on its node
    (the route for a rank on another node than the driver's) reads the same stack."""
    hosts = colocate(_pool(2), RunNames.new("quartet-tests", "hang"), stalling=RoleSpec(Stalling))
    pid = int(hosts.nodes[1]["pid"])

    def stop_in_update() -> None:  # py-spy reads the running rank until it is inside `update`, then stops it
        until = time.monotonic() + DEADLINE_S
        while "Stalling.update (" not in py_spy_stacks(pid) and time.monotonic() < until:
            time.sleep(0.05)
        os.kill(pid, signal.SIGSTOP)

    stopper = threading.Thread(target=stop_in_update, daemon=True)
    try:
        stopper.start()
        with pytest.raises(HangError) as caught, _timer(tmp_path, 3)("update_actor"):
            hosts.groups["stalling"].call(Stalling.update, 1)
        stopper.join(timeout=30)
        assert process_state(pid) == "T"
        through_tasks = collect_stacks(hosts.nodes, here=None)
        with pytest.raises(WorkerError) as outside:  # a wait outside every phase: the call timeout's error
            hosts.health(timeout_s=2.0)
    finally:
        stopper.join(timeout=30)
        os.kill(pid, signal.SIGCONT)  # ours to undo, before the hosts are shut down
        hosts.shutdown()
    message = str(caught.value)
    assert "rank 1: stopped (SIGSTOP), roles_for_tests.py:107 Stalling.update on " in message, message
    stacks = (tmp_path / "hang_3.txt").read_text().split("## rank 1 (SILENT)")[1]
    assert f"process state: stopped (SIGSTOP); pid {pid}" in stacks and "Stalling.update (" in stacks
    assert "ping() gave no answer within 2 s" in str(outside.value)
    assert "ranks still running: [1]; rank 1: stopped (SIGSTOP)" in str(outside.value)
    assert (
        through_tasks[1].startswith("process state: stopped (SIGSTOP)")
        and "Stalling.update (" in through_tasks[1]
    )


def test_rank_blocked_in_a_collective_its_peer_skipped_is_named(ray_cluster: None, tmp_path: Path) -> None:
    hosts = colocate(_pool(2), RunNames.new("quartet-tests", "hang"), reducer=RoleSpec(AllReducer))
    try:
        start = time.monotonic()
        with pytest.raises(HangError) as caught, _timer(tmp_path, 2)("update_weights"):
            hosts.groups["reducer"].call(AllReducer.all_reduce_except, 1)
        assert time.monotonic() - start < HANG_GUARD_S
    finally:
        hosts.shutdown()
    message = str(caught.value)
    assert "phase 'update_weights' of step 2" in message and "silent ranks [0]" in message
    assert "all_reduce" in message.split("top frames:")[1]  # rank 0's innermost Python frame
    stacks = (tmp_path / "hang_2.txt").read_text()
    assert "## rank 0 (SILENT)" in stacks and "## rank 1 (answered)" in stacks
    assert "all_reduce_except" in stacks.split("## rank 0")[1].split("## rank 1")[0]


def test_the_stack_dump_leaves_no_file_behind(tmp_path: Path) -> None:
    """The per-process stacks file is read through /proc while the process lives and is gone with it."""
    code = (
        "import os, signal, sys\n"
        "from quartet.cluster.watchdog import dump_stacks, install_stack_dump\n"
        "path = install_stack_dump('probe:0')\n"
        "print(path)\n"
        "print(dump_stacks(os.getpid(), path, wait_s=5.0))\n"
        "print(sorted(os.listdir(sys.argv[1])))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("/proc/") and "/fd/" in lines[0]
    assert "<module>" in out.stdout  # the dump holds the main thread's stack
    assert lines[-1] == "[]"  # no named file (nor folder) while the process runs
    assert os.listdir(tmp_path) == []  # nor after it ended
