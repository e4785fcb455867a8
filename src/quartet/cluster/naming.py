"""Names of a run's actors: `<run prefix>:<host label>:<rank>` in an explicit Ray namespace."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quartet.tracking.run_layout import CLUSTER_FILE

__all__ = ["RunNames", "parse_actor_name", "write_json_atomic"]


def write_json_atomic(path: Path, data: Any) -> Path:
    """Write `data` as JSON to `path` through a temporary file and a rename: a reader (or a crash) never
    sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
    return path


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

    @staticmethod
    def for_run(namespace: str, run_prefix: str, experiment: str) -> RunNames:
        """A run's names: `run_prefix` when set (`cluster.run_prefix`), else a fresh one (`new`)."""
        return RunNames(namespace, run_prefix) if run_prefix else RunNames.new(namespace, experiment)

    def actor_prefix(self, label: str) -> str:
        return f"{self.prefix}:{label}:"

    def actor_name(self, label: str, rank: int) -> str:
        return f"{self.actor_prefix(label)}{rank}"

    def save(self, run_dir: str | Path, ranks: dict[str, list[dict[str, Any]]] | None = None) -> Path:
        """Record the names in the run folder, for `quartet doctor` and processes that attach later.

        `ranks`: where each host ran, by host label, one `{rank, node_id, ip, pid}` per rank
        (`quartet.cluster.run_record.record_hosts` fills it); written as the `ranks` key."""
        data: dict[str, Any] = asdict(self)
        if ranks is not None:
            data["ranks"] = ranks
        return write_json_atomic(Path(run_dir) / CLUSTER_FILE, data)

    @staticmethod
    def load(run_dir: str | Path) -> RunNames:
        """The names of a run folder's `cluster.json` (any version: keys added later are ignored here)."""
        data = json.loads((Path(run_dir) / CLUSTER_FILE).read_text())
        return RunNames(data["namespace"], data["prefix"], data.get("address", ""))


def parse_actor_name(name: str) -> tuple[str, str, int] | None:
    """(prefix, label, rank) of a quartet actor name, or None for other names."""
    prefix, sep1, rest = name.rpartition(":")
    run, sep2, label = prefix.rpartition(":")
    if not (sep1 and sep2 and rest.isdigit() and run):
        return None
    return run, label, int(rest)
