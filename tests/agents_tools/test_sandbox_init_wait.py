"""The sandbox init's wait for the program, at the deadline: a program that has exited is reported as exited
(its status kept), one still running is a wall-clock kill. Before this, the deadline was an exception raised
by SIGALRM; on a loaded machine it once landed between the wait that reaped the program and the line that
kept its status, and init died without a report ("the sandbox failed to start"). Each case runs in a fresh
interpreter: the wait reaps any child of its process."""

from __future__ import annotations

import json
import subprocess
import sys

_SCRIPT = """
import json, os, signal, sys, time
from quartet.agents.tools.sandbox_boot import _wait_for_program
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
program_runs_s, pause_before_wait_s, deadline_in_s = map(float, sys.argv[1:4])
program = os.fork()
if program == 0:
    time.sleep(program_runs_s)
    os._exit(7)
if os.fork() == 0:  # another child that exits at once: reaped on the way, not taken for the program
    os._exit(0)
time.sleep(pause_before_wait_s)
start = time.monotonic()
ended = _wait_for_program(program, start + deadline_in_s)
waited = time.monotonic() - start
if ended is None:
    os.kill(program, signal.SIGKILL)
    os.waitpid(program, 0)
print(json.dumps({"exit_code": None if ended is None else os.WEXITSTATUS(ended[0]), "waited_s": waited}))
"""


def _wait(program_runs_s: float, pause_before_wait_s: float, deadline_in_s: float) -> dict[str, float]:
    argv = [str(program_runs_s), str(pause_before_wait_s), str(deadline_in_s)]
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, float] = json.loads(proc.stdout)
    return result


def test_a_program_that_exited_before_the_deadline_keeps_its_status_even_when_the_wait_starts_late() -> None:
    result = _wait(program_runs_s=0.0, pause_before_wait_s=0.5, deadline_in_s=-1.0)
    assert result["exit_code"] == 7


def test_a_program_that_exits_during_the_wait_is_reported_when_it_exits() -> None:
    result = _wait(program_runs_s=0.6, pause_before_wait_s=0.0, deadline_in_s=20.0)
    assert result["exit_code"] == 7
    assert result["waited_s"] < 15.0  # woken by its SIGCHLD, not by the deadline


def test_a_program_still_running_at_the_deadline_is_a_wall_clock_kill() -> None:
    result = _wait(program_runs_s=30.0, pause_before_wait_s=0.0, deadline_in_s=0.5)
    assert result["exit_code"] is None
    assert 0.5 <= result["waited_s"] < 10.0
