"""A run's total resident memory, held to a cap by killing the whole run: the aggregate limit.

RLIMIT_AS caps each process alone, so 8 children of 400 MB each held 3 GB. A memory cgroup would be the
kernel's way; cgroups are not writable in every container this runs in (and v1 or v2 differ), so a
watchdog on the host polls the run's process tree (every descendant of the process it started: inside a
PID namespace, and under the boot script's subreaper without one, orphans stay in that tree) and kills
all of it when the sum of its proportional set sizes (PSS: a page shared by n processes counts 1/n to
each, so forked children that share their parent's pages are not counted n times) passes the cap. What
it cannot hold: memory allocated within one polling interval past the cap (a few
tens of MB), and tmpfs files, which no process holds (bwrap caps /tmp and /dev/shm by size instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable

__all__ = ["kill_tree", "process_tree", "watch_memory"]

_PAGE = os.sysconf("SC_PAGE_SIZE")
_shared: tuple[float, dict[int, tuple[int, int]]] = (float("-inf"), {})  # the last scan, for all watchers


def _scan() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, resident bytes)} of every process in /proc; vanished ones skipped."""
    found: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rpartition(b")")[2].split()
            except OSError:
                continue
            found[int(name)] = (int(fields[1]), int(fields[21]) * _PAGE)
    return found


def _proportional(process: tuple[int, int]) -> int:
    """A process's PSS in bytes (/proc/PID/smaps_rollup); its resident size where that is unreadable."""
    pid, resident = process
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) << 10  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resident


def _scan_shared(max_age_s: float) -> dict[int, tuple[int, int]]:
    """`_scan()`, reused while younger than `max_age_s`: concurrent runs' watchdogs share one scan of /proc
    per interval (a scan costs milliseconds, and they run on the event loop)."""
    global _shared
    now = time.monotonic()
    if now - _shared[0] > max_age_s:
        _shared = (now, _scan())
    return _shared[1]


def process_tree(root: int, max_age_s: float = 0.0) -> dict[int, int]:
    """{pid: resident bytes} of `root` and all its descendants (as of a scan at most `max_age_s` old)."""
    table = _scan_shared(max_age_s) if max_age_s > 0 else _scan()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    tree: dict[int, int] = {}
    stack = [root] if root in table else []
    while stack:
        pid = stack.pop()
        if pid not in tree:
            tree[pid] = table[pid][1]
            stack += children.get(pid, [])
    return tree


def kill_tree(root: int) -> None:
    """SIGKILL `root`'s session group and every descendant, a few rounds (a fork may race a round).

    Only while `root` is unreaped: once reaped, its pid may belong to another process."""
    for _ in range(5):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGKILL)
        tree = process_tree(root)
        if not tree:
            return
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


async def watch_memory(root: int, cap_bytes: int, alive: Callable[[], bool], interval_s: float = 0.05) -> int:
    """Poll `root`'s tree until its resident total passes `cap_bytes`; then kill it, return the total.

    `alive()` says whether `root` is still unreaped (so its pid is not someone else's yet); checked right
    before each kill, with no await between. Runs until cancelled otherwise (the caller cancels it).
    """
    while alive():
        total = sum(map(_proportional, process_tree(root, max_age_s=interval_s / 2).items()))
        if total > cap_bytes and alive():
            kill_tree(root)
            return total
        await asyncio.sleep(interval_s)
    await asyncio.Event().wait()  # ended without a kill: wait for the caller's cancel
    raise AssertionError("unreachable")
