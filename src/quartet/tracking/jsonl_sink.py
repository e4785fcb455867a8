"""`<run dir>/metrics.jsonl`: one JSON object per record, the run's record of truth.

Always on. The file is opened for appending (a resumed run adds to it; `quartet plot` keeps the last record
of each step) and flushed after every record, so a crash loses nothing that was logged. Records are written
as given, with `"time": time.time()` added after `kind` when absent; values JSON cannot hold natively
(numpy scalars, paths) are written as their `.item()` or `str()`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["JsonlSink", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"


def _to_json(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy / torch scalars
    return item() if callable(item) else str(value)


class JsonlSink:
    """Appends records to one JSONL file; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def stamp(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """The record as it will be stored: `time` added (after `kind`) when absent."""
        if "time" in record:
            return dict(record)
        return {"kind": record.get("kind"), "time": time.time(), **record}

    def log(self, record: Mapping[str, Any]) -> None:
        if self._file.closed:
            raise ValueError(f"{self.path} is closed: the run's Tracking was closed before this record")
        self._file.write(json.dumps(record, default=_to_json) + "\n")
        self._file.flush()

    def phase(self, name: str) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        self._file.close()
