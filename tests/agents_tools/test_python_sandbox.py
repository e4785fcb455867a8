"""The Python tool's sandbox, with and without Linux namespaces: each limit stops real abuse, nothing is left
running, the temporary directory goes, and the host (this test process) keeps working."""

from __future__ import annotations

import asyncio
import os
import resource
import select
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from quartet.agents.tools.base import ToolResult
from quartet.agents.tools.executor import run_tool_calls
from quartet.agents.tools.parsing import ToolCall
from quartet.agents.tools.python_runner import PythonTool


@pytest.fixture(params=[True, False], ids=["namespaces", "no-namespaces"])
def tool(request: pytest.FixtureRequest) -> PythonTool:
    return PythonTool(timeout_s=2, cpu_time_s=1, memory_mb=256, max_processes=16, namespaces=request.param)


@pytest.fixture
def workdirs(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Records the temporary directories the runner makes."""
    made: list[Path] = []
    real = tempfile.mkdtemp

    def spy(*args: Any, **kwargs: Any) -> str:
        path = real(*args, **kwargs)
        made.append(Path(path))
        return path

    monkeypatch.setattr(tempfile, "mkdtemp", spy)
    return made


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def _run(tool: PythonTool, code: str) -> ToolResult:
    return asyncio.run(tool.execute("test", {"code": code}))


def _leftovers(workdirs: list[Path]) -> list[psutil.Process]:
    """Live processes whose working directory is one of the run's (every sandbox process starts there)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.cwd().startswith(tuple(map(str, workdirs))):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_leftover_check_sees_a_survivor(tmp_path: Path) -> None:
    """The check used below does find a process left in a run's directory (so its silence means something)."""
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=tmp_path)
    try:
        assert [p.pid for p in _leftovers([tmp_path])] == [survivor.pid]
    finally:
        survivor.kill()
        survivor.wait()
    assert _leftovers([tmp_path]) == []


def _assert_clean(workdirs: list[Path]) -> None:
    deadline = time.monotonic() + 2.0
    while (left := _leftovers(workdirs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"
    assert workdirs and not any(d.exists() for d in workdirs), "temporary directory not removed"


def test_normal_output(tool: PythonTool, workdirs: list[Path]) -> None:
    result = _run(tool, "import os\nprint(sum(i * i for i in range(100)))\nprint(os.getcwd())")
    expected = sum(i * i for i in range(100))
    lines = result.text.splitlines()
    assert lines[:3] == ["exit status 0", "[stdout]", str(expected)]
    assert lines[3] == str(workdirs[0]), "the program runs in its fresh temporary directory"
    assert result.error is None and result.metrics["python/stopped"] == 0
    _assert_clean(workdirs)


def test_error_exit_status_and_stderr(tool: PythonTool, workdirs: list[Path]) -> None:
    result = _run(tool, "import sys\nprint('partial')\nsys.stderr.write('oops\\n')\nraise SystemExit(3)")
    assert result.text == "exit status 3\n[stdout]\npartial\n\n[stderr]\noops\n"
    traceback = _run(tool, "def f():\n    return 1 / 0\nf()")
    assert "exit status 1" in traceback.text and 'File "main.py", line 2, in f' in traceback.text
    assert traceback.text.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "sandbox_boot" not in traceback.text, "the bootstrap's frame is not shown"


def test_stdin_is_closed_and_output_truncated(tool: PythonTool) -> None:
    result = _run(tool, "import sys\nprint(repr(sys.stdin.read()))\nprint('x' * 100_000)")
    assert result.text.startswith("exit status 0\n[stdout]\n''\n")
    assert "...[output truncated: 100004 bytes in all]" in result.text
    assert len(result.text) < 4096 + 200


@pytest.mark.slow
def test_cpu_loop_is_stopped(tool: PythonTool, workdirs: list[Path]) -> None:
    start = time.monotonic()
    result = _run(tool, "while True:\n    pass")
    assert time.monotonic() - start < 4.0
    assert result.error in ("killed: CPU time limit 1 s", "killed: wall-clock limit 2 s"), result.text
    assert result.text.startswith("killed: ")
    _assert_clean(workdirs)


@pytest.mark.slow
def test_sleeping_program_hits_wall_clock(tool: PythonTool, workdirs: list[Path]) -> None:
    start = time.monotonic()
    result = _run(tool, "import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert 1.9 < time.monotonic() - start < 4.0
    assert result.error == "killed: wall-clock limit 2 s"
    assert result.text == "killed: wall-clock limit 2 s\n[stdout]\nstarted\n"
    _assert_clean(workdirs)


@pytest.mark.parametrize(
    "code", ["x = bytearray(10**10)", "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))"]
)
def test_memory_bomb_is_stopped(tool: PythonTool, workdirs: list[Path], code: str) -> None:
    start = time.monotonic()
    result = _run(tool, code)
    assert time.monotonic() - start < 3.0
    assert result.error == "MemoryError: memory limit 256 MiB", result.text
    assert result.text.startswith("exit status 1; MemoryError: memory limit 256 MiB")
    _assert_clean(workdirs)


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
def test_fork_bomb_is_stopped_and_nothing_survives(tool: PythonTool, workdirs: list[Path], code: str) -> None:
    start = time.monotonic()
    result = _run(tool, code)
    assert time.monotonic() - start < 5.0
    assert result.error is not None, result.text
    assert result.error.startswith(("process limit reached", "killed: ")), result.text
    _assert_clean(workdirs)
    _assert_host_unharmed()


def test_processes_that_leave_the_group_are_killed(tool: PythonTool, workdirs: list[Path]) -> None:
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
    result = _run(tool, code)
    assert result.text == "exit status 0\n[stdout]\nparent done\n"
    _assert_clean(workdirs)


def _server_saw_connection(server: socket.socket) -> bool:
    readable, _, _ = select.select([server], [], [], 0.3)
    return bool(readable)


def test_network_is_refused(tool: PythonTool, workdirs: list[Path], listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    connect = _run(tool, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
    plain = _run(tool, "import socket\nsocket.socket()")
    for result in (connect, plain):
        assert result.error == "network access is disabled in this sandbox", result.text
        assert "PermissionError: network access is disabled in this sandbox" in result.text
    assert not _server_saw_connection(listener)
    pair = _run(tool, "import asyncio\nasync def f():\n    return 7\nprint(asyncio.run(f()))")
    assert pair.text == "exit status 0\n[stdout]\n7\n", "local socketpairs (asyncio) still work"
    _assert_clean(workdirs)


def test_network_namespace_holds_against_raw_sockets(listener: socket.socket) -> None:
    tool = PythonTool(timeout_s=2, cpu_time_s=1, memory_mb=256, namespaces=True)
    port = listener.getsockname()[1]
    code = (  # socket(2) and connect(2) through libc: the audit hook never sees them
        "import ctypes, socket, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
        f"addr = struct.pack('!HH4s8x', socket.AF_INET, {port}, socket.inet_aton('127.0.0.1'))\n"
        "addr = struct.pack('H', socket.AF_INET) + addr[2:]\n"
        "print('connect', libc.connect(fd, addr, len(addr)), ctypes.get_errno())\n"
    )
    result = _run(tool, code)
    if result.metrics["python/namespaces"] == 0:
        pytest.skip("Linux namespaces are not available here: only the audit-hook guard applies")
    assert "connect -1" in result.text, result.text
    assert not _server_saw_connection(listener)


def test_other_programs_and_foreign_signals_are_refused(tool: PythonTool) -> None:
    spawn = _run(tool, "import subprocess\nsubprocess.run(['true'])")
    assert spawn.error == "running other programs is disabled in this sandbox", spawn.text
    system = _run(tool, "import os\nos.system('true')")
    assert "PermissionError: running other programs is disabled" in system.text
    kill = _run(tool, f"import os, signal\nos.kill({os.getpid()}, signal.SIGTERM)")
    refused = "PermissionError: signals to processes outside this program are disabled"
    hidden = "ProcessLookupError"  # in a PID namespace the host's processes do not exist
    assert refused in kill.text or (tool.namespaces and hidden in kill.text), kill.text


@pytest.mark.slow
def test_cancelled_call_kills_the_program(tool: PythonTool, workdirs: list[Path]) -> None:
    async def main() -> tuple[list[ToolResult], dict[str, float]]:
        iid = await tool.create()
        call = ToolCall("python", {"code": "import os, time\nos.fork()\ntime.sleep(60)"})
        return await run_tool_calls([call], {"python": tool}, {"python": iid}, 0.5, 1000)

    start = time.monotonic()
    results, metrics = asyncio.run(main())
    assert time.monotonic() - start < 1.5, "the executor's timeout (0.5 s) came before the tool's (2 s)"
    assert results[0].text == "Error: tool 'python' timed out after 0.5 s"
    assert metrics["tool/timeouts"] == 1
    _assert_clean(workdirs)


def _assert_host_unharmed() -> None:
    """This process can still fork and start programs, and its own limits are untouched."""
    assert resource.getrlimit(resource.RLIMIT_NPROC)[0] != 16 + 2
    assert resource.getrlimit(resource.RLIMIT_AS) == (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "42"
    with socket.create_server(("127.0.0.1", 0)) as server:  # and use the network
        socket.create_connection(server.getsockname(), timeout=5).close()


def test_host_unharmed_after_runs(tool: PythonTool) -> None:
    _run(tool, "x = bytearray(10**10)")
    _assert_host_unharmed()
