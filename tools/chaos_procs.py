"""Process and file helpers of the chaos soak (`tools/chaos_soak.py`): its own process tree only.

The soak makes itself a child subreaper (Linux `prctl(PR_SET_CHILD_SUBREAPER)`): a process that any of its
runs started and whose parent died (a SIGKILLed driver's raylet, the Ray workers under it, its reward
workers) is re-parented to the soak instead of to init. "Processes of the soak's runs" is then exactly
"descendants of the soak", found by parenthood in /proc, never by a name pattern over the whole host.
Linux only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make orphans of this process's descendants its children; False where the kernel refuses."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    return False


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) of `pid`, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1])


def cmdline(pid: int) -> str:
    """The command line of `pid` ('' when gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _parents() -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                out[int(entry)] = st
    return out


def descendants(root: int, include_zombies: bool = False) -> list[int]:
    """Every live descendant of `root` (not `root` itself), by parenthood."""
    table = _parents()
    kids: dict[int, list[int]] = {}
    for pid, (_, ppid) in table.items():
        kids.setdefault(ppid, []).append(pid)
    found: list[int] = []
    todo = list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        if include_zombies or table[pid][0] != "Z":
            found.append(pid)
        todo.extend(kids.get(pid, []))
    return sorted(found)


def is_descendant(pid: int, root: int) -> bool:
    """Whether `pid` is alive and below `root` in the process tree."""
    return pid in descendants(root)


def reap_orphans(keep: set[int]) -> None:
    """Collect the exit status of zombie children re-parented to this subreaper (not the Popen ones in
    `keep`, whose status their Popen object reads)."""
    me = os.getpid()
    for pid, (state, ppid) in _parents().items():
        if ppid == me and state == "Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def survivors(root: int, grace_s: float, keep: set[int]) -> list[int]:
    """Descendants of `root` still alive after waiting up to `grace_s` for them to go (reaping meanwhile)."""
    deadline = time.monotonic() + grace_s
    while True:
        reap_orphans(keep)
        alive = descendants(root)
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.5)


def kill_all(pids: list[int]) -> None:
    """SIGCONT (a stopped one cannot die of SIGTERM) then SIGKILL each of `pids` (all ours)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def mount_tmpfs(path: Path, size_mib: int) -> str:
    """Mount a tmpfs of `size_mib` at `path` ('' on success, else why not: it needs root)."""
    import subprocess

    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "not root: a tmpfs cannot be mounted"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "soak-tmpfs", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return "" if done.returncode == 0 else f"mount failed: {done.stderr.strip()[:200]}"


def unmount(path: Path) -> None:
    """Unmount what `mount_tmpfs` mounted (lazily, so a straggler's open file cannot block it)."""
    import subprocess

    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def fill(path: Path, leave_bytes: int) -> int:
    """Write a file under `path` until its filesystem is full, then give `leave_bytes` back; its size."""
    chunk = b"\0" * (1 << 20)
    size = 0
    with open(path / "soak_filler.bin", "wb", buffering=0) as f:
        while True:
            try:
                size += f.write(chunk)
            except OSError:  # ENOSPC: full (a last partial write may have landed)
                break
        size = max(0, os.fstat(f.fileno()).st_size - leave_bytes)
        os.ftruncate(f.fileno(), size)
    return size


def unix_sockets(pid: int) -> list[str]:
    """Paths of the unix sockets `pid` holds open (from /proc/net/unix by the inodes of its fds)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    paths = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes:
                paths.append(fields[7])
    return paths


def ray_dashboard_temp_dirs(root: int) -> set[str]:
    """The folders of the unix sockets that the Ray dashboard's multiprocessing forkserver (a descendant of
    `root`) listens on: Ray kills its dashboard at shutdown, so that folder (`$TMPDIR/pymp-*`) is left by
    Ray, not by quartet."""
    found: set[str] = set()
    for pid in descendants(root):
        line = cmdline(pid)
        if "multiprocessing.forkserver" in line and "ray.dashboard" in line:
            found.update(str(Path(p).parent) for p in unix_sockets(pid))
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
