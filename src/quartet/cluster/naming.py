"""Names of a run's actors: `<run prefix>:<host label>:<rank>` in an explicit Ray namespace."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = ["RunNames", "parse_actor_name"]

LOCATION_FILE = "cluster.json"


@dataclass(frozen=True)
class RunNames:
    """Where a run's actors can be found: cluster address, namespace and name prefix."""

    namespace: str
    prefix: str
    address: str = ""

    @staticmethod
    def new(namespace: str, experiment: str, address: str = "") -> RunNames:
        """Names for a new run: prefix `<experiment>-<UTC start time>`."""
        return RunNames(namespace, f"{experiment}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}", address)

    def actor_prefix(self, label: str) -> str:
        return f"{self.prefix}:{label}:"

    def actor_name(self, label: str, rank: int) -> str:
        return f"{self.actor_prefix(label)}{rank}"

    def save(self, run_dir: str | Path) -> Path:
        """Record the names in the run folder, for `quartet doctor` and processes that attach later."""
        path = Path(run_dir) / LOCATION_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")
        return path

    @staticmethod
    def load(run_dir: str | Path) -> RunNames:
        data = json.loads((Path(run_dir) / LOCATION_FILE).read_text())
        return RunNames(data["namespace"], data["prefix"], data.get("address", ""))


def parse_actor_name(name: str) -> tuple[str, str, int] | None:
    """(prefix, label, rank) of a quartet actor name, or None for other names."""
    prefix, sep1, rest = name.rpartition(":")
    run, sep2, label = prefix.rpartition(":")
    if not (sep1 and sep2 and rest.isdigit() and run):
        return None
    return run, label, int(rest)
