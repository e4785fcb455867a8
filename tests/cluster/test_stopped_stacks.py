"""A stopped process's Python stack: read by py-spy, its state named; never "(no Python frame)".

Each test starts its own Python subprocess, stops it with SIGSTOP, and continues and ends it (by its pid)
whatever happens.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quartet.cluster import stopped_stacks
from quartet.cluster.watchdog import PhaseDeadline, dump_stacks, hang_error, top_frame

PROBE = """
import sys, threading, time
from quartet.cluster.watchdog import install_stack_dump

def wait_in_the_step():
    print(install_stack_dump("probe:0"), flush=True)
    while True:
        time.sleep(0.01)

threading.Thread(target=time.sleep, args=(600,), name="side", daemon=True).start()
wait_in_the_step()
"""


@pytest.fixture
def stopped(tmp_path: Path) -> Iterator[tuple[int, str]]:
    """A Python process that registered its stack dump and sits in `wait_in_the_step`, stopped by SIGSTOP:
    its pid and stacks file."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()  # the dump is installed and the loop begins
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while stopped_stacks.process_state(proc.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        yield proc.pid, path
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=30)


def test_a_stopped_process_is_read_by_py_spy_with_its_state(stopped: tuple[int, str]) -> None:
    pid, path = stopped
    assert stopped_stacks.process_state(pid) == "T"
    start = time.monotonic()
    text = dump_stacks(pid, path)
    took = time.monotonic() - start
    assert text.startswith(f"process state: stopped (SIGSTOP); pid {pid}\n"), text
    assert "wait_in_the_step (" in text and "probe.py:" in text  # the frame the process stopped in
    assert top_frame(text).startswith("probe.py:") and top_frame(text).endswith(" wait_in_the_step")
    assert '"side"' not in text  # a thread only in the standard library's sleep is counted, not listed
    assert "1 more thread(s)" in text
    assert took < 3.0  # no wait for a handler that cannot run: py-spy reads at once (about 0.1 s)
    assert os.path.getsize(path) == 0  # no signal was left pending to dump when the process goes on


def test_the_hang_error_names_the_state_and_the_frame(stopped: tuple[int, str], tmp_path: Path) -> None:
    """The whole report without Ray: the silent rank's section of the hang file and the error's line."""
    pid, path = stopped
    watch = PhaseDeadline("update_actor", 7, 3.0, tmp_path / "hang_7.txt", 0.0)
    nodes = [{"pid": pid, "stacks_file": path, "node_id": "local", "ip": "127.0.0.1"}]
    error = hang_error("actor", "update", watch, [0], nodes)
    assert error.silent == [0]
    message = str(error)  # a process that is no quartet host runs no driver's call
    assert "rank 0: stopped (SIGSTOP), in no call (the call had not started), probe.py:" in message
    assert f" wait_in_the_step on 127.0.0.1 (node local, pid {pid})" in message
    section = (tmp_path / "hang_7.txt").read_text().split("## rank 0 (SILENT) on 127.0.0.1")[1]
    assert f"process state: stopped (SIGSTOP); pid {pid}" in section and "wait_in_the_step (" in section


def test_without_py_spy_the_stack_is_missing_with_the_fix(
    stopped: tuple[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stopped_stacks, "py_spy_path", lambda: None)
    text = dump_stacks(stopped[0], stopped[1])
    assert "stopped (SIGSTOP)" in text and "py-spy is not installed here" in text
    assert "pip install py-spy" in text and "SYS_PTRACE" in text


def test_a_failing_py_spy_names_its_error_and_the_fix() -> None:
    """A py-spy that cannot read (here: a pid that is no Python process) gives its own error, not nothing."""
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        text = stopped_stacks.py_spy_stacks(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait(timeout=30)
    assert text.startswith("(no Python stack: `py-spy dump --nonblocking --pid")
    assert "failed: " in text and "ptrace" in text


def test_a_running_process_still_answers_through_its_handler(tmp_path: Path) -> None:
    """Not stopped: the faulthandler route, as before (no py-spy, no state line)."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        text = dump_stacks(proc.pid, path)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not text.startswith("process state:") and "most recent call first" in text
    assert "wait_in_the_step" in text


BLOCKED = """
import signal, time
from quartet.cluster.watchdog import HANG_SIGNAL, install_stack_dump

def blocked_in_the_step():
    path = install_stack_dump("probe:0")
    signal.pthread_sigmask(signal.SIG_BLOCK, {HANG_SIGNAL})  # the handler can never run
    print(path, flush=True)  # only once blocked: a busy machine must not let the signal in before
    while True:
        time.sleep(0.01)

blocked_in_the_step()
"""


def test_a_rank_whose_handler_does_not_answer_is_read_by_py_spy(tmp_path: Path) -> None:
    """Running, but the signal never reaches its handler (here: blocked): after `ANSWER_WAIT_S` py-spy."""
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKED)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        path = proc.stdout.readline().strip()
        start = time.monotonic()
        text = dump_stacks(proc.pid, path)
        took = time.monotonic() - start
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert text.startswith("process state: ") and "its faulthandler wrote nothing within 2 s" in text
    assert "blocked_in_the_step (" in text and top_frame(text).endswith(" blocked_in_the_step")
    assert took < 2.0 + stopped_stacks.PY_SPY_TIMEOUT_S  # DUMP_WAIT_S: the bound of one rank's read


def test_process_state_of_no_process_is_none() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=30)
    assert stopped_stacks.process_state(gone.pid) is None
    assert stopped_stacks.describe_state(None).startswith("unknown")
