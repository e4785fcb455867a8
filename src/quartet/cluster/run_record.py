"""What a run folder says about the run, for `quartet doctor` and people reading it after the fact.

Two files, each written whole through a temporary file and a rename (`write_json_atomic`):

`cluster.json` (Ray backend) — where the actors are and where each rank ran:

    {"namespace": "quartet", "prefix": "grpo-20260101-120000", "address": "10.0.0.1:6379",
     "ranks": {"rl": [{"rank": 0, "node_id": "ab12...", "ip": "10.0.0.1", "pid": 4242}, ...]}}

`ranks` is keyed by host label (the main pool `rl`, a separate pool by its role, `sft`); a file written
before `ranks` existed still loads (`RunNames.load`, `load_ranks` gives {}).

`run_state.json` (every backend) — whether the driver is running, finished or failed:

    {"state": "running", "driver_pid": 4100, "hostname": "head-0", "started_at": 1767268800.0,
     "ended_at": null, "error": ""}

`state` is `running` (written as the workers start), `finished` (the loop and the shutdown ended
normally) or `failed` (the driver caught an exception: `error` is its type and first line). A driver
killed outright (SIGKILL, its machine lost) leaves `running`: the doctor then looks whether `driver_pid`
still lives on `hostname`. Times are Unix seconds.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from quartet.cluster.naming import RunNames, write_json_atomic
from quartet.tracking.run_layout import CLUSTER_FILE, RUN_STATE_FILE

__all__ = [
    "RankPlace",
    "RunState",
    "load_ranks",
    "load_run_state",
    "mark_failed",
    "mark_finished",
    "mark_running",
    "record_hosts",
]

State = Literal["running", "finished", "failed"]


@dataclass(frozen=True)
class RankPlace:
    """Where one rank of a host set ran."""

    rank: int
    node_id: str
    ip: str
    pid: int


@dataclass(frozen=True)
class RunState:
    """The driver's own account of the run (see the module docstring)."""

    state: State
    driver_pid: int
    hostname: str
    started_at: float
    ended_at: float | None = None
    error: str = ""

    def driver_alive(self) -> bool | None:
        """Whether the driver process still exists: None when it ran on another machine (cannot tell)."""
        if self.hostname != socket.gethostname():
            return None
        try:
            os.kill(self.driver_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it exists
            return True
        return True


class _Places(Protocol):
    """What `record_hosts` reads of a host set (a `HostSet`): its label and one node fact per rank."""

    label: str
    nodes: list[dict[str, Any]]


def record_hosts(run_dir: str | Path, names: RunNames, host_sets: Iterable[_Places]) -> Path:
    """Write `cluster.json`: the run's names and, per host label and rank, its node id, IP and pid."""
    ranks = {
        hosts.label: [
            asdict(RankPlace(int(n.get("rank", r)), str(n["node_id"]), str(n["ip"]), int(n["pid"])))
            for r, n in enumerate(hosts.nodes)
        ]
        for hosts in host_sets
    }
    return names.save(run_dir, ranks)


def load_ranks(run_dir: str | Path) -> dict[str, list[RankPlace]]:
    """Per host label, where each rank ran ({} for a `cluster.json` written before ranks were recorded)."""
    data = json.loads((Path(run_dir) / CLUSTER_FILE).read_text())
    return {label: [RankPlace(**p) for p in places] for label, places in data.get("ranks", {}).items()}


def mark_running(run_dir: str | Path) -> RunState:
    """Record that this process drives the run from now on."""
    state = RunState("running", os.getpid(), socket.gethostname(), time.time())
    write_json_atomic(Path(run_dir) / RUN_STATE_FILE, asdict(state))
    return state


def mark_finished(run_dir: str | Path) -> RunState:
    """Record a normal end (keeps the start facts of `mark_running`)."""
    return _end(run_dir, "finished", "")


def mark_failed(run_dir: str | Path, error: BaseException) -> RunState:
    """Record a failure with one line naming it: `ExceptionType: first line of its message`."""
    lines = str(error).strip().splitlines()
    return _end(run_dir, "failed", f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": "))


def load_run_state(run_dir: str | Path) -> RunState | None:
    """The run folder's state record, or None when it has none (a run older than the record)."""
    path = Path(run_dir) / RUN_STATE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return RunState(
        data["state"],
        int(data["driver_pid"]),
        str(data["hostname"]),
        float(data["started_at"]),
        data.get("ended_at"),
        str(data.get("error", "")),
    )


def _end(run_dir: str | Path, state: State, error: str) -> RunState:
    before = load_run_state(run_dir)
    start = before.started_at if before is not None else time.time()
    ended = RunState(state, os.getpid(), socket.gethostname(), start, time.time(), error)
    write_json_atomic(Path(run_dir) / RUN_STATE_FILE, asdict(ended))
    return ended
