"""Ray's agents leave with the driver that started their local Ray, even a SIGKILLed one.

Measured with Ray 2.60 (2 cores, a local `ray.init` like a quartet run's): after a SIGKILL of the driver,
the GCS, raylet, dashboard and workers exit within ~3 s, but the dashboard agent and the runtime-env agent
(~200 MiB together) live ~62 s more. They notice the raylet's death at once, then report it to the GCS
(`publish_error_to_driver`, a 60 s timeout written into Ray) although the GCS is dead too. No setting
shortens that call, and a killed driver runs no finalizer.

So `start_reaper` (for a Ray this process started) launches a tiny watcher process. It waits on a pipe
from the driver; end-of-file means the driver is gone, however it died. Meanwhile it notes the raylet's
children (the agents and workers; their command line is renamed `ray::DashboardAgent` and their
environment may be overwritten by that renaming, so parenthood is what identifies them, and only while the
raylet lives), each with its start time so a reused pid is never taken for one: the driver passes those it
sees when it starts the watcher, and the watcher looks again every 0.1 s for its first 5 s (when Ray
starts them), then twice a second. When the driver is gone it terminates (SIGTERM,
then SIGKILL after 2 s) the processes noted, and those whose command line passes them the session folder
(`--session-dir=`, `--session_dir=`, `--log-dir=`, `--logs-dir=`: the GCS, raylet, dashboard, monitors).
Nothing else is touched (a `tail` of a session log is no Ray process). After a normal `ray.shutdown()`
little is left to do, and the watcher stops once the raylet is gone. The agents run with the dashboard off
too (`cluster.dashboard`, off by default), so the watcher is needed either way.

This file runs as a script (`python reaper.py SESSION_DIR RAYLET_PIDS PID:START...`), so the watcher
imports nothing of quartet, ray or torch: a bare Python (~10 MB). Linux only (it reads /proc); elsewhere
none is started.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["session_pids", "start_reaper"]

log = logging.getLogger(__name__)
_GRACE_S = 2.0  # after SIGTERM, before SIGKILL
_TICKS_S = (0.1, 5.0, 0.5)  # the watcher notes the raylet's children every 0.1 s for 5 s, then 0.5 s
_watchers: list[subprocess.Popen[bytes]] = []  # held so their pipes stay open while this process lives
Noted = dict[int, int]  # pid -> start time (clock ticks since boot, /proc/<pid>/stat field 22)


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # gone, or not ours to read
        return b""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of `pid`, None when it is gone."""
    raw = _read(Path(f"/proc/{pid}/stat"))
    fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) "; comm may hold spaces
    if len(fields) < 20:
        return None
    return int(fields[1]), int(fields[19])


def _pids() -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def session_pids(session_dir: str, exclude: int) -> list[int]:
    """PIDs of the processes whose command line passes them `session_dir` (Linux /proc), except `exclude`."""
    folder = session_dir.rstrip("/")
    needles = [
        f"{flag}={folder}".encode()
        for flag in ("--session-dir", "--session_dir", "--log-dir", "--logs-dir", "--log_dir")
    ]
    found = []
    for pid in _pids():
        if pid != exclude and any(n in _read(Path(f"/proc/{pid}/cmdline")) for n in needles):
            found.append(pid)
    return found


def _raylets(session_dir: str, me: int) -> list[int]:
    """The session's raylet pids (`--raylet_socket_name=<session>/...` in their command line)."""
    needle = f"--raylet_socket_name={session_dir.rstrip('/')}/".encode()
    return [p for p in session_pids(session_dir, me) if needle in _read(Path(f"/proc/{p}/cmdline"))]


def _note_children(parents: set[int], noted: Noted, me: int) -> None:
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[0] in parents and pid != me:
            noted[pid] = stat[1]


def _noted_now(raylets: list[int], me: int) -> Noted:
    """The raylets and their children now, with their start times."""
    noted: Noted = {}
    for pid in raylets:
        stat = _stat(pid)
        if stat is not None:
            noted[pid] = stat[1]
    _note_children(set(raylets), noted, me)
    return noted


def _still(noted: Noted) -> list[int]:
    """The noted processes still running (same pid and start time: not a reused pid)."""
    out = []
    for pid, started in noted.items():
        stat = _stat(pid)
        if stat is not None and stat[1] == started:
            out.append(pid)
    return out


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            continue


def _reap(session_dir: str, raylets: set[int], noted: Noted) -> None:
    """Note the raylets' children until the driver goes (end of stdin), then end the session's processes.

    Should the raylet go first (`ray.shutdown()` in a driver that lives on, a raylet crash), only its noted
    children are ended (the agents would linger all the same) and the watching stops.
    """
    me, fast, until, slow = os.getpid(), *_TICKS_S
    start, driver_gone = time.monotonic(), False
    own = {p: t for p, t in noted.items() if p in raylets}
    while not driver_gone:
        _note_children(raylets, noted, me)
        tick = fast if time.monotonic() - start < until else slow
        ready, _, _ = select.select([0], [], [], tick)
        driver_gone = bool(ready) and not os.read(0, 1 << 16)
        if own and not _still(own):
            break
    _note_children(raylets, noted, me)  # a child started since the last tick, if the raylet still lives

    def left() -> list[int]:
        rest = [p for p in session_pids(session_dir, me) if p not in noted] if driver_gone else []
        return _still(noted) + rest

    pids = left()
    _signal_all(pids, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_S
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = left()
    _signal_all(pids, signal.SIGKILL)


def start_reaper(session_dir: str) -> Any:
    """Start the watcher of this driver's local Ray session (see the module docstring); the Popen or None."""
    if not sys.platform.startswith("linux") or not Path("/proc/self/stat").exists() or not session_dir:
        return None
    raylets = _raylets(session_dir, os.getpid())  # found now, while they live
    noted = [f"{pid}:{started}" for pid, started in _noted_now(raylets, os.getpid()).items()]
    watcher = subprocess.Popen(  # it excludes itself (its command line names the session) by pid
        [sys.executable, "-S", __file__, session_dir, ",".join(map(str, raylets)), *noted],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C to the driver's group does not end the watcher first
    )
    _watchers.append(watcher)
    log.debug("Ray session %s (raylet %s) watched by pid %d", session_dir, raylets, watcher.pid)
    return watcher


if __name__ == "__main__":
    _reap(
        sys.argv[1],
        {int(pid) for pid in sys.argv[2].split(",") if pid},
        {int(p): int(t) for p, t in (arg.split(":") for arg in sys.argv[3:])},
    )
