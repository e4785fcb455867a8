"""The Python tool's sandbox in every mode this machine offers (bwrap, and the unisolated guard with and
without namespaces): each limit stops real abuse, nothing is left running, the temporary directory goes, and
the host (this test process) keeps working. The hostile corpus, and what the boundary adds, is in
test_python_sandbox_hostile.py."""

from __future__ import annotations

import asyncio
import os
import resource
import secrets
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sandbox_helpers import SANDBOX_UID_BASE, SandboxRuns, assert_clean, leftovers, make_tool, run

from quartet.agents.tools.base import ToolResult
from quartet.agents.tools.executor import run_tool_calls
from quartet.agents.tools.parsing import ToolCall
from quartet.agents.tools.python_runner import PythonTool

# Hang guards only (the tool's wall limit is 2 s): a busy shared machine may be slow, never this slow.
_HANG_GUARD_S = 15.0


def _sleeper(cwd: Path, uid: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "30"], cwd=cwd, user=uid, group=uid)


def test_leftover_check_sees_a_survivor(tmp_path: Path) -> None:
    """The check used below does find a process left in a run's directory (so its silence means something)."""
    survivor = _sleeper(tmp_path)
    try:
        assert [p.pid for p in leftovers(SandboxRuns([tmp_path]))] == [survivor.pid]
    finally:
        survivor.kill()
        survivor.wait()
    assert leftovers(SandboxRuns([tmp_path])) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="runs take fresh uids on a root host only")
def test_leftover_check_sees_the_runs_uid_and_not_another_runs(tmp_path: Path) -> None:
    """A process of this test's run uid is found wherever it went; one of another run's uid (a second
    copy of the suite on this machine, say) is not this test's to report."""
    mine, theirs = (SANDBOX_UID_BASE + secrets.randbelow(500_000_000) for _ in range(2))  # fresh, as runs'
    own, foreign = _sleeper(Path("/"), mine), _sleeper(Path("/"), theirs)
    try:
        assert [p.pid for p in leftovers(SandboxRuns([tmp_path], {mine}))] == [own.pid]
    finally:
        for proc in (own, foreign):
            proc.kill()
            proc.wait()


def test_normal_output(tool: PythonTool, runs: SandboxRuns) -> None:
    result = run(tool, "import os\nprint(sum(i * i for i in range(100)))\nprint(os.getcwd())")
    expected = sum(i * i for i in range(100))
    lines = result.text.splitlines()
    assert lines[:3] == ["exit status 0", "[stdout]", str(expected)]
    scratch = "/tmp" if tool.isolated else str(runs.workdirs[0])
    assert lines[3] == scratch, "the program runs in its fresh scratch folder"
    assert result.metrics["python/isolated"] == float(tool.isolated)
    assert result.error is None and result.metrics["python/stopped"] == 0
    assert_clean(runs)


def test_error_exit_status_and_stderr(tool: PythonTool, runs: SandboxRuns) -> None:
    result = run(tool, "import sys\nprint('partial')\nsys.stderr.write('oops\\n')\nraise SystemExit(3)")
    assert result.text == "exit status 3\n[stdout]\npartial\n\n[stderr]\noops\n"
    traceback = run(tool, "def f():\n    return 1 / 0\nf()")
    assert "exit status 1" in traceback.text and 'File "main.py", line 2, in f' in traceback.text
    assert traceback.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "sandbox_boot" not in traceback.text, "the bootstrap's frame is not shown"


def test_stdin_is_closed_and_output_truncated(tool: PythonTool) -> None:
    result = run(tool, "import sys\nprint(repr(sys.stdin.read()))\nprint('x' * 100_000)")
    assert result.text.startswith("exit status 0\n[stdout]\n''\n")
    assert "...[output truncated: 100004 bytes in all]" in result.text
    assert len(result.text) < 4096 + 200


@pytest.mark.slow
def test_cpu_loop_is_stopped(tool: PythonTool, runs: SandboxRuns) -> None:
    start = time.monotonic()
    result = run(tool, "while True:\n    pass")
    assert time.monotonic() - start < _HANG_GUARD_S
    assert result.error in ("killed: CPU time limit 1 s", "killed: wall-clock limit 2 s"), result.text
    assert result.text.startswith("killed: ")
    assert_clean(runs)


@pytest.mark.slow
def test_sleeping_program_hits_wall_clock(tool: PythonTool, runs: SandboxRuns) -> None:
    start = time.monotonic()
    result = run(tool, "import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert 1.9 < time.monotonic() - start < _HANG_GUARD_S
    assert result.error == "killed: wall-clock limit 2 s"
    assert result.text == "killed: wall-clock limit 2 s\n[stdout]\nstarted\n"
    assert_clean(runs)


@pytest.mark.parametrize(
    "code", ["x = bytearray(10**10)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"]
)
def test_memory_bomb_is_stopped(tool: PythonTool, runs: SandboxRuns, code: str) -> None:
    start = time.monotonic()
    result = run(tool, code)
    assert time.monotonic() - start < _HANG_GUARD_S
    # One process near the cap: its own limit (MemoryError) or the total's (the watchdog) stops it first
    per_process = "MemoryError: memory limit 256 MiB"
    total = "killed: memory limit 256 MiB for all processes together ("
    assert result.error is not None and result.error.startswith((per_process, total)), result.text
    assert result.text.startswith((f"exit status 1; {per_process}", total))
    assert_clean(runs)


@pytest.mark.parametrize(
    "code",
    [
        "import os\nwhile True:\n    os.fork()",
        # forks through libc directly: past the audit hook, only the kernel limit holds (spins until 2 s)
        pytest.param(
            "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()", marks=pytest.mark.slow
        ),
    ],
    ids=["os.fork", "libc.fork"],
)
def test_fork_bomb_is_stopped_and_nothing_survives(tool: PythonTool, runs: SandboxRuns, code: str) -> None:
    start = time.monotonic()
    result = run(tool, code)
    assert time.monotonic() - start < _HANG_GUARD_S
    assert result.error is not None, result.text
    assert result.error.startswith(("process limit reached", "killed: ")), result.text
    assert_clean(runs)
    _assert_host_unharmed()


def test_processes_that_leave_the_group_are_killed(tool: PythonTool, runs: SandboxRuns) -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"  # a new session: out of the program's process group
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"  # an orphan, in no group the sandbox made
        "    os._exit(0)\n"
        "time.sleep(0.2)\n"
        "print('parent done')\n"
    )
    result = run(tool, code)
    assert result.text == "exit status 0\n[stdout]\nparent done\n"
    assert_clean(runs)


def _server_saw_connection(server: socket.socket) -> bool:
    readable, _, _ = select.select([server], [], [], 0.3)
    return bool(readable)


def test_network_is_refused(tool: PythonTool, runs: SandboxRuns, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    connect = run(tool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    plain = run(tool, "import socket\nsocket.socket()")
    for result in (connect, plain):
        assert result.error == "network access is disabled in this sandbox", result.text
        assert "PermissionError: network access is disabled in this sandbox" in result.text
    assert not _server_saw_connection(listener)
    pair = run(tool, "import asyncio\nasync def f():\n    return 7\nprint(asyncio.run(f()))")
    assert pair.text == "exit status 0\n[stdout]\n7\n", "local socketpairs (asyncio) still work"
    assert_clean(runs)


def test_raw_sockets_are_refused(tool: PythonTool, listener: socket.socket) -> None:
    """socket(2) and connect(2) through libc: the audit hook never sees them; seccomp and namespaces do."""
    port = listener.getsockname()[1]
    code = (  # socket(2) and connect(2) through libc: the audit hook never sees them
        "import ctypes, socket, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
        f"addr = struct.pack('!HH4s8x', socket.AF_INET, {port}, socket.inet_aton('127.0.0.1'))\n"
        "addr = struct.pack('H', socket.AF_INET) + addr[2:]\n"
        "print('connect', libc.connect(fd, addr, len(addr)), ctypes.get_errno())\n"
    )
    result = run(tool, code)
    assert "connect -1" in result.text, result.text
    assert not _server_saw_connection(listener)


def test_other_programs_and_foreign_signals_are_refused(tool: PythonTool) -> None:
    spawn = run(tool, "import subprocess\nsubprocess.run(['true'])")
    assert spawn.error == "running other programs is disabled in this sandbox", spawn.text
    system = run(tool, "import os\nos.system('true')")
    assert "PermissionError: running other programs is disabled" in system.text
    kill = run(tool, f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)")
    refused = "PermissionError: signals to processes outside this program are disabled"
    hidden = "ProcessLookupError"  # in a PID namespace the host's processes do not exist
    in_pid_namespace = tool.isolated or tool.namespaces
    assert refused in kill.text or (in_pid_namespace and hidden in kill.text), kill.text


@pytest.mark.slow
def test_cancelled_call_kills_the_program(tool: PythonTool, runs: SandboxRuns) -> None:
    async def main() -> tuple[list[ToolResult], dict[str, float]]:
        iid = await tool.create()
        call = ToolCall("python", {"code": "import os, time\nos.fork()\ntime.sleep(60)"})
        return await run_tool_calls([call], {"python": tool}, {"python": iid}, 0.5, 1000)

    start = time.monotonic()
    results, metrics = asyncio.run(main())
    assert time.monotonic() - start < _HANG_GUARD_S
    assert results[0].text == "Error: tool 'python' timed out after 0.5 s"
    assert metrics["tool/timeouts"] == 1
    assert_clean(runs)


def _assert_host_unharmed() -> None:
    """This process can still fork and start programs, and its own limits are untouched."""
    assert resource.getrlimit(resource.RLIMIT_NPROC)[0] != 16 + 2
    assert resource.getrlimit(resource.RLIMIT_AS) == (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "42"
    with socket.create_server(("127.0.0.1", 0)) as server:  # and use the network
        socket.create_connection(server.getsockname(), timeout=5).close()


def test_host_unharmed_after_runs(tool: PythonTool) -> None:
    run(tool, "x = bytearray(10**10)")
    _assert_host_unharmed()


def test_forked_children_sharing_pages_are_not_counted_twice(mode: str) -> None:
    """12 children of a parent holding numpy (~30 MB resident each by RSS, 360 MB summed) share those
    pages: the total-memory cap (256 MiB) counts them once (PSS), so an ordinary worker pool runs."""
    code = (
        "import os, time\n"
        "import numpy\n"
        "children = []\n"
        "for _ in range(12):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        time.sleep(0.6)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "print(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in children))\n"
    )
    result = run(make_tool(mode, timeout_s=10, cpu_time_s=10, memory_mb=256, max_processes=16), code)
    assert result.text == "exit status 0\n[stdout]\n12\n", result.text
