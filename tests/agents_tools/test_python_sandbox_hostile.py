"""The hostile corpus against the Python tool, in every mode this machine offers (issue 18, part 4).

Each case is what a hostile run did to the earlier guard. With the bwrap boundary every case is stopped.
In the unisolated mode (only where the config accepts it) the cases it still holds are asserted, and the
ones it cannot hold are skipped with the reason, so the test report lists them:

    case                                   bwrap     unisolated (root host)
    append to a root-owned file            stopped   not held: the program keeps root's file-owner access
    create a file in a root-owned folder   stopped   not held: as above
    ctypes socket + connect to loopback    stopped   stopped (seccomp: only AF_UNIX sockets)
    ctypes execv / system                  stopped   stopped (seccomp: no execve)
    ctypes unshare / ptrace                stopped   stopped (seccomp)
    the boot's processes' /proc files      stopped   not held: filesystem uid 0 opens them
    files left in /dev/shm and /tmp        stopped   not held: the host's /dev/shm is shared
    host processes and a canary in /proc   stopped   not held: the host's procfs is mounted
    8 children x 100 MB under a 256 MB cap stopped   stopped (watchdog on the process tree)
    daemon (double fork, setsid)           stopped   stopped (subreaper, uid sweep)
    1 GB of output, 1 GB into a file       stopped   stopped (capture cap, RLIMIT_FSIZE)
    no boundary, allow_unisolated off      refused (both: the tool cannot be built)

Fork bombs, sleeps and CPU loops are in test_python_sandbox.py, for every mode.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_helpers import MISSING_BWRAP, SandboxRuns, assert_clean, make_tool, run

from quartet.agents.tools.python_runner import PythonTool
from quartet.agents.tools.registry import ToolConfigError, build_tools
from quartet.agents.tools.sandbox import SandboxLimits, SandboxUnavailableError, run_python


@pytest.fixture
def tool(mode: str) -> PythonTool:
    """Generous time (a busy machine must not turn a case into a wall-clock kill), small file limits."""
    return make_tool(
        mode, timeout_s=10, cpu_time_s=10, memory_mb=256, max_processes=16, max_file_mb=16, scratch_mb=8
    )


def _not_held(tool: PythonTool, what: str) -> None:
    if not tool.isolated:
        pytest.skip(f"the unisolated mode does not hold this (documented): {what}")


@pytest.fixture
def root_owned() -> Iterator[tuple[Path, Path, list[Path]]]:
    """A root-owned 0644 file and 0755 folder the sandbox can see (in the Python prefix, bound read-only),
    and fresh names in root-owned folders; whatever a failing run made there is removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs a root host: the case is root-owned files the program must not change")
    tag = secrets.token_hex(4)
    file, folder = Path(sys.prefix, f"quartet-hostile-{tag}.txt"), Path(sys.prefix, f"quartet-hostile-{tag}")
    fresh = [folder / "new.py", Path(sys.prefix, f"quartet-hostile-{tag}.py"), Path(f"/usr/hostile-{tag}")]
    file.write_text("reward = 1.0\n")
    file.chmod(0o644)
    folder.mkdir(mode=0o755)
    try:
        yield file, folder, fresh
    finally:
        for path in [file, *fresh]:
            path.unlink(missing_ok=True)
        folder.rmdir()


def test_root_owned_files_are_read_only(tool: PythonTool, root_owned: tuple[Path, Path, list[Path]]) -> None:
    _not_held(tool, "a root host's program keeps file-owner access to root's files")
    file, folder, fresh = root_owned
    # Only the fixture's file gets content; the project's own files (the boot script, the standard
    # library) are opened for appending and closed unchanged, so a regression here harms nothing.
    code = (
        "import os\n"
        "wrote = []\n"
        f"for path, text in [({str(file)!r}, 'reward = 99.0'), ('/run/quartet/sandbox_boot.py', ''),\n"
        "                   (os.__file__, '')] + [(p, '') for p in " + repr([str(p) for p in fresh]) + "]:\n"
        "    try:\n"
        "        with open(path, 'a') as f:\n"
        "            f.write(text)\n"
        "        wrote.append(path)\n"
        "    except OSError as exc:\n"
        "        print('refused', path, type(exc).__name__)\n"
        "open('/tmp/scratch.txt', 'w').write('ok')\n"
        "print('wrote', wrote)\n"
    )
    result = run(tool, code)
    assert "wrote []" in result.text, result.text
    assert result.text.count("refused ") == 6, result.text
    assert file.read_text() == "reward = 1.0\n", "the root-owned file changed"
    assert list(folder.iterdir()) == [], "a file appeared in the root-owned folder"
    assert not any(path.exists() for path in fresh), "a file appeared in a root-owned folder"


def _saw_connection(server: socket.socket) -> bool:
    readable, _, _ = select.select([server], [], [], 0.3)
    return bool(readable)


def test_ctypes_socket_cannot_reach_a_loopback_listener(tool: PythonTool, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    code = (
        "import ctypes, socket, struct\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"addr = struct.pack('=H', socket.AF_INET) + struct.pack('!H4s8x', {port}, bytes([127, 0, 0, 1]))\n"
        "for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_PACKET):\n"
        "    fd = libc.socket(family, socket.SOCK_STREAM if family < 16 else socket.SOCK_RAW, 0)\n"
        "    print('socket', int(family), fd)\n"
        "    if fd >= 0 and family == socket.AF_INET:\n"
        "        print('connect', libc.connect(fd, addr, len(addr)))\n"
    )
    result = run(tool, code)
    assert result.text.count("socket ") == 4 and "socket 2 -1" in result.text, result.text
    assert "connect 0" not in result.text, result.text
    assert not _saw_connection(listener), "the listener was reached"


def test_ctypes_exec_runs_no_program(tool: PythonTool, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    shell = f"echo pwned > {marker}; echo pwned"
    code = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"print('system', libc.system({shell.encode()!r}))\n"
        f"argv = (ctypes.c_char_p * 4)(b'/bin/sh', b'-c', {shell.encode()!r}, None)\n"
        "print('execv', libc.execv(b'/bin/sh', argv), ctypes.get_errno())\n"
        "print('still here')\n"
    )
    result = run(tool, code)
    assert "still here" in result.text, result.text
    assert "pwned" not in result.text.replace(shell, "") and not marker.exists(), result.text


def test_no_new_namespaces_no_ptrace_but_threads_and_forks_work(tool: PythonTool) -> None:
    code = (
        "import ctypes, os, threading\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print('ptrace', libc.ptrace(16, os.getppid(), None, None), ctypes.get_errno())\n"  # ATTACH
        "got = []\n"
        "t = threading.Thread(target=got.append, args=(7,))\n"
        "t.start(); t.join()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(3)\n"
        "print('thread', got, 'fork', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
    )
    result = run(tool, code)
    assert "unshare -1 1\n" in result.text and "ptrace -1 1\n" in result.text, result.text
    assert "thread [7] fork 3" in result.text, result.text


def test_the_sandbox_own_processes_are_out_of_reach(tool: PythonTool) -> None:
    """The boot's init (the program's parent, same uid) holds the status pipe to the host: not reachable."""
    _not_held(tool, "a root host's program keeps filesystem uid 0, which opens root-owned /proc files")
    code = (
        "import os\n"
        "try:\n"
        "    print('fds', os.listdir(f'/proc/{os.getppid()}/fd'))\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    assert run(tool, code).text == "exit status 0\n[stdout]\nrefused\n"


def test_nothing_is_left_in_dev_shm_or_tmp(tool: PythonTool) -> None:
    _not_held(tool, "the program writes the host's /dev/shm and the run's folder is its /tmp")
    tag = f"quartet-hostile-{secrets.token_hex(4)}"
    code = (
        "import os\n"
        f"for folder in ('/dev/shm', '/tmp', os.environ['TMPDIR']):\n"
        f"    with open(os.path.join(folder, {tag!r}), 'wb') as f:\n"
        "        f.write(b'x' * (4 << 20))\n"
        "print('written')\n"
    )
    assert "written" in run(tool, code).text
    for folder in ("/dev/shm", "/tmp"):
        assert not Path(folder, tag).exists(), f"{folder}/{tag} outlived the run"
    later = run(tool, f"import os\nprint([os.path.exists(d + '/{tag}') for d in ('/dev/shm', '/tmp')])")
    assert "[False, False]" in later.text, "a file passed from one run to the next"


def test_scratch_is_capped(tool: PythonTool) -> None:
    """1 GB into a file: the scratch is full (bwrap: an 8 MiB tmpfs) or the file is cut (RLIMIT_FSIZE)."""
    code = (
        "import os\n"
        "chunk = b'x' * (1 << 20)\n"
        "with open(os.path.join(os.environ['TMPDIR'], 'big'), 'wb') as f:\n"
        "    for _ in range(1024):\n"
        "        f.write(chunk)\n"
    )
    result = run(tool, code)
    assert result.error is not None or "Error" in result.text, result.text
    assert "No space left on device" in result.text or "File too large" in result.text, result.text


@pytest.fixture
def canary() -> Iterator[tuple[str, int]]:
    """A host process with a secret on its command line."""
    secret = f"canary-{secrets.token_hex(8)}"
    proc = subprocess.Popen(["sleep", "60", secret])
    try:
        yield secret, proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_proc_shows_only_the_run(tool: PythonTool, canary: tuple[str, int]) -> None:
    _not_held(tool, "the host's /proc is mounted: its processes and their command lines are visible")
    secret, _ = canary
    code = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "seen = []\n"
        "for pid in pids:\n"
        "    try:\n"
        "        seen.append(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\\0', b' ').decode())\n"
        "    except OSError:\n"
        "        pass\n"
        "print(len(pids), 'processes')\n"
        "for line in seen:\n"
        "    print('cmd', line[:200])\n"
    )
    result = run(tool, code)
    assert secret not in result.text, "the canary secret was read"
    commands = [line for line in result.text.splitlines() if line.startswith("cmd ")]
    assert commands, result.text
    for command in commands:  # bwrap's init, the boot script's three processes: nothing of the host
        assert "bwrap" in command or "sandbox_boot.py" in command, command
    assert len(commands) <= 5, result.text


def test_memory_is_capped_for_all_processes_together(mode: str) -> None:
    tool = make_tool(mode, timeout_s=10, cpu_time_s=10, memory_mb=256, max_processes=16)
    code = (  # one child at a time, 0.3 s apart: the watchdog has time to see each step
        "import os, time\n"
        "ready, told = os.pipe()\n"
        "children = []\n"
        "for i in range(8):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        block = bytearray(100 << 20)\n"  # each below the per-process limit (256 MiB)
        "        print('child', i, 'holds 100 MB', flush=True)\n"
        "        os.write(told, b'x')\n"
        "        time.sleep(3)\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "    os.read(ready, 1)\n"
        "    time.sleep(0.3)\n"
        "for pid in children:\n"
        "    os.waitpid(pid, 0)\n"
        "print('all 8 held 800 MB')\n"
    )
    start = time.monotonic()
    result = run(tool, code)
    assert time.monotonic() - start < 10 + 5, "hang guard: the run was not stopped"
    assert "all 8 held" not in result.text, result.text
    assert result.text.count("holds 100 MB") <= 3, result.text
    assert result.error is not None and "memory limit 256 MiB for all processes together" in result.error


def test_a_daemon_does_not_outlive_the_call(tool: PythonTool, runs: SandboxRuns) -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"  # the daemon: no parent, no group, no session of the run's
        "        os.closerange(0, 3)\n"
        "        while True:\n"
        "            time.sleep(0.1)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "print('main done')\n"
    )
    result = run(tool, code)
    assert result.text == "exit status 0\n[stdout]\nmain done\n", result.text
    assert_clean(runs)


def test_a_flood_of_output_is_cut(tool: PythonTool) -> None:
    code = "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(chunk)\n"
    start = time.monotonic()
    result = run(tool, code)
    assert time.monotonic() - start < 10 + 5, "hang guard"
    assert "...[output truncated: " in result.text
    assert len(result.text) < 4096 + 300


def test_no_boundary_refuses_unless_accepted(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError, match="allow_unisolated: true") as refused:
        PythonTool(bwrap=MISSING_BWRAP)
    assert f"no bwrap binary at {MISSING_BWRAP}" in str(refused.value)
    with pytest.raises(SandboxUnavailableError):
        asyncio.run(run_python("print(1)", SandboxLimits(), bwrap=MISSING_BWRAP))
    entry = {"class": "quartet.agents.tools.python_runner:PythonTool", "config": {"bwrap": MISSING_BWRAP}}
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.config: .*SandboxUnavailableError"):
        build_tools({"tools": [entry]}, "tools.yaml")
    refusing = tmp_path / "bwrap"  # a bwrap that runs but cannot make namespaces, as under Docker's policy
    refusing.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    refusing.chmod(0o755)
    with pytest.raises(SandboxUnavailableError, match="cannot build a sandbox here .*No permissions"):
        PythonTool(bwrap=str(refusing))
    accepted = PythonTool(bwrap=MISSING_BWRAP, allow_unisolated=True)
    assert not accepted.isolated and "unisolated" in accepted.description
    result = run(accepted, "print(6 * 7)")
    assert result.text == "exit status 0\n[stdout]\n42\n" and result.metrics["python/isolated"] == 0.0


def test_the_mode_is_told_to_the_model_and_in_the_outcome(tool: PythonTool) -> None:
    description = tool.description
    assert ("It runs isolated" in description) == tool.isolated
    assert ("It runs unisolated" in description) == (not tool.isolated)
    assert run(tool, "pass").metrics["python/isolated"] == float(tool.isolated)
