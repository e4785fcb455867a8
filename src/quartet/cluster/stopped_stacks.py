"""The Python stacks of a process that cannot answer a signal: its state from `/proc` and py-spy's read.

The hang watchdog (`quartet.cluster.watchdog`) asks a silent rank for its stacks with `faulthandler` on a
signal. A process stopped by SIGSTOP (or by a debugger) runs no signal handler until it is continued, and
one in an uninterruptible kernel wait runs it late or never; the signal then stays pending and the rank's
stack would be lost. py-spy (installed with Ray) reads a process's Python stacks from its memory instead:
with `--nonblocking` it neither attaches nor suspends, so it reads a stopped process too (without it py-spy
tries to suspend the process, which fails on a stopped one: "Failed to get stack traces").

Reading another process's memory needs ptrace permission over it: the same user (and, where the kernel's
Yama module is set to 1, a parent of the process, or `CAP_SYS_PTRACE`), or root. Every rank is read on its
own node (the watchdog runs these functions there), as the rank's own user.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = [
    "PY_SPY_TIMEOUT_S",
    "describe_state",
    "is_stopped",
    "process_state",
    "py_spy_path",
    "py_spy_stacks",
    "py_spy_top_frame",
    "runs_a_call",
]

PY_SPY_TIMEOUT_S = 3.0
"""One py-spy read: it takes 10-100 ms on an idle machine; the rest is room for a loaded node."""

_STATES = {
    "T": "stopped (SIGSTOP)",
    "t": "stopped by a debugger (ptrace)",
    "D": "in an uninterruptible kernel wait (state D: disk, network file system or driver)",
    "Z": "a zombie (exited, not yet reaped)",
    "X": "dead",
    "R": "running",
    "S": "sleeping",
    "I": "idle",
}
_FIX = (
    "fix: `pip install py-spy` in the environment of the ranks (Ray installs it), and give the ranks' user "
    "ptrace permission over its own processes (as non-root in a container: `--cap-add SYS_PTRACE`, or "
    "`kernel.yama.ptrace_scope=0`)"
)


def process_state(pid: int) -> str | None:
    """The one-letter state of `pid` (`R`, `S`, `D`, `T`, `t`, `Z`, ...) from `/proc/<pid>/stat`; None where
    there is no such process or no `/proc`."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    after = text.rfind(")")  # the command name in parentheses may hold spaces and parentheses itself
    return (text[after + 2 : after + 3] or None) if after >= 0 else None


def describe_state(code: str | None) -> str:
    """The state letter in words (`T` -> `stopped (SIGSTOP)`)."""
    if code is None:
        return "unknown (no /proc entry: the process is gone, or no /proc here)"
    return _STATES.get(code, f"state {code}")


def is_stopped(code: str | None) -> bool:
    """A stopped process (SIGSTOP, SIGTSTP or a tracer): it runs no signal handler until continued."""
    return code in ("T", "t")


def py_spy_path() -> str | None:
    """py-spy next to this interpreter (the venv Ray installed it into), else on `PATH`; None if absent."""
    beside = Path(sys.executable).with_name("py-spy")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def py_spy_stacks(pid: int, timeout_s: float = PY_SPY_TIMEOUT_S) -> str:
    """`pid`'s Python stacks as py-spy reads them (`dump --nonblocking`, full file names), trimmed to the
    threads that run code beyond Ray's and the standard library's idle loops; or one paragraph saying why
    not, with py-spy's own error and the fix. Never raises."""
    exe = py_spy_path()
    if exe is None:
        return f"(no Python stack: py-spy is not installed here; {_FIX})\n"
    cmd = [exe, "dump", "--nonblocking", "--full-filenames", "--pid", str(pid)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"(no Python stack: `py-spy dump --nonblocking --pid {pid}` ran past {timeout_s:.0f} s)\n"
    except OSError as err:
        return f"(no Python stack: py-spy at {exe} could not run: {err}; {_FIX})\n"
    if out.returncode != 0 or "Thread " not in out.stdout:
        error = " ".join((out.stderr or out.stdout).strip().split("\n\n")[0].split())[:400]
        return f"(no Python stack: `py-spy dump --nonblocking --pid {pid}` failed: {error}; {_FIX})\n"
    return _trim(out.stdout)


_THREAD = re.compile(r'^Thread (?P<tid>0x[0-9A-Fa-f]+|\d+) \((?P<status>[^)]*)\)(?:: "(?P<name>[^"]*)")?')
_PY_SPY_FRAME = re.compile(r"^\s+(?P<fn>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
_IDLE_FILES = re.compile(
    r"(/ray/|/threading\.py$|/concurrent/futures/|/queue\.py$|/selectors\.py$|/asyncio/)"
)


def _threads(dump: str) -> list[list[str]]:
    """py-spy's dump as one list of lines per thread (its header line first)."""
    threads: list[list[str]] = []
    for line in dump.splitlines():
        if _THREAD.match(line):
            threads.append([line])
        elif threads and line.strip():
            threads[-1].append(line)
    return threads


def _useful(thread: list[str]) -> bool:
    files = [m["file"] for m in map(_PY_SPY_FRAME.match, thread[1:]) if m]
    return not files or any(not _IDLE_FILES.search(f) for f in files)


_WRAPPERS = re.compile(r"/torch/nn/modules/module\.py$")


def _trim_frames(thread: list[str]) -> list[str]:
    """A thread's lines without torch's `Module.__call__` wrappers between forwards (counted) and, in the
    thread that runs a driver's call, without Ray's actor loop beneath the host's `call`/`execute`."""
    out, wrappers = [thread[0]], 0
    for line in thread[1:]:
        m = _PY_SPY_FRAME.match(line)
        if m and _WRAPPERS.search(m["file"]) and m["fn"].endswith("call_impl"):
            wrappers += 1
            continue
        out.append(line)
        if m and _is_call(m):
            below = len(thread) - thread.index(line) - 1
            if below:
                out.append(f"    ({below} frames of Ray's actor loop below)")
            break
    if wrappers:
        out.append(f"    ({wrappers} frames of torch's Module.__call__ wrappers left out)")
    return out


def _trim(dump: str) -> str:
    """The threads that run something of their own, the one that runs a driver's call first; the idle
    loops of Ray's and the standard library's threads counted, not listed."""
    threads = _threads(dump)
    kept = [t for t in threads if _useful(t)] or threads
    kept.sort(key=lambda t: not _runs_call(t))
    left = len(threads) - len(kept)
    text = "\n".join("\n".join(_trim_frames(t)) for t in kept) + "\n"
    if left:
        text += f"({left} more thread(s) only in Ray's or the standard library's waits, left out)\n"
    return f"Python stacks read by py-spy (most recent call first):\n{text}"


def _is_call(m: re.Match[str]) -> bool:
    """The host's `call`/`execute` frame: where a driver's call enters the rank (`quartet.cluster.host`)."""
    return m["file"].endswith(os.path.join("cluster", "host.py")) and m["fn"].split(".")[-1] in (
        "call",
        "execute",
    )


def _runs_call(thread: list[str]) -> bool:
    return any(m is not None and _is_call(m) for m in map(_PY_SPY_FRAME.match, thread[1:]))


def runs_a_call(dump: str) -> bool:
    """A thread of py-spy's `dump` runs a driver's call (its stack passes through the host's `call` or
    `execute`); False for a host that was stopped between calls, whose call has not started."""
    return any(_runs_call(t) for t in _threads(dump))


def py_spy_top_frame(dump: str) -> str | None:
    """`file:line function` of the innermost frame of the thread that runs the driver's call (through the
    host's `call`/`execute`), else of the main thread, else of the first; None when `dump` has no py-spy
    frame."""
    threads = [t for t in _threads(dump) if any(_PY_SPY_FRAME.match(line) for line in t[1:])]
    if not threads:
        return None
    main = [t for t in threads if '"MainThread"' in t[0]]
    chosen = ([t for t in threads if _runs_call(t)] or main or threads)[0]
    m = next(m for m in map(_PY_SPY_FRAME.match, chosen[1:]) if m)
    return f"{Path(m['file']).name}:{m['line']} {m['fn']}"
