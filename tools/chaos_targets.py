"""What a chaos-soak fault hits and where it is named (`tools/chaos_soak.py`): a rank's pid from the run's
`cluster.json`, a reward worker among the driver's descendants, the first log line naming the fault."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from chaos_procs import cmdline, descendants

__all__ = ["first_match", "rank_pid", "reward_worker"]


def rank_pid(run_dir: Path, label: str, rng: random.Random) -> int:
    """The pid of a random rank of role group `label` (`rl`, `rollout`); -1 when the run has none."""
    data = json.loads((run_dir / "cluster.json").read_text())
    places = data.get("ranks", {}).get(label, [])
    return int(rng.choice(places)["pid"]) if places else -1


def reward_worker(driver_pid: int, rng: random.Random) -> int:
    """The pid of a random reward scoring worker under the driver; -1 when there is none."""
    kids = [p for p in descendants(driver_pid) if "quartet.rewards.worker" in cmdline(p)]
    return rng.choice(kids) if kids else -1


def first_match(lines: list[str], start: int, pattern: str) -> str | None:
    """The first line matching `pattern` from line `start - 1` on: `start` counted the log's last element,
    a line still being written (or split's empty tail), which a fault's own line may complete."""
    rx = re.compile(pattern)
    return next((line.strip()[:300] for line in lines[max(start - 1, 0) :] if rx.search(line)), None)
