"""`<run dir>/metrics.jsonl`: one JSON object per record, the run's record of truth.

Always on. The file is opened for appending (a resumed run adds to it; `quartet plot` keeps the last record
of each step) and flushed after every record, so a crash loses nothing that was logged. Records are written
as given, with `"time": time.time()` added after `kind` when absent; values JSON cannot hold natively
(numpy scalars, paths) are written as their `.item()` or `str()`.

A write cut short (a full disk, a power loss, a kill mid-write) leaves a torn last line. `drop_torn_tail`
truncates the file to its last complete line and warns with the file and the bytes dropped; the sink calls
it before appending, so the next record starts on a line of its own. `read_records` reads the records and
raises `MetricsFileError` (file and line) for a bad line that is not the last: that is not a torn write,
and a resume that silently dropped it would rewrite the file without it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["JsonlSink", "MetricsFileError", "drop_torn_tail", "read_records"]
log = logging.getLogger(__name__)


class MetricsFileError(ValueError):
    """A metrics file line that is not a JSON object and is not a torn last line."""


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError
        return False


def drop_torn_tail(path: Path) -> int:
    """Truncate `path` to its last complete line when its last line is torn (no newline at its end, or not
    a JSON object); return the bytes dropped (0: nothing torn or no file) after a warning naming them."""
    if not path.exists():
        return 0
    with path.open("rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        tail_start = max(0, size - (1 << 20))  # a record is far below 1 MiB
        fh.seek(tail_start)
        tail = fh.read()
        body = tail[:-1] if tail.endswith(b"\n") else tail
        cut = body.rfind(b"\n") + 1  # start of the last line, within `tail`
        last = tail[cut:]
        if last.endswith(b"\n") and (not last.strip() or _is_record(last)):
            return 0
        keep = tail_start + cut
        fh.truncate(keep)
    dropped = size - keep
    log.warning(
        "%s: dropped a torn last line (%d bytes: %r), the trace of a write cut short (full disk, power "
        "loss or a kill); the records before it are kept",
        path,
        dropped,
        last[:80],
    )
    return dropped


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics file (blank lines skipped); `MetricsFileError` names the file and line of a
    line that is not a JSON object. Call `drop_torn_tail` first to forgive a torn last line."""
    records = []
    with path.open("rb") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as err:
                raise MetricsFileError(
                    f"{path}, line {number}: not a JSON record ({err}); only a torn last line is dropped "
                    "on its own. Fix: delete or repair that line, or start over with trainer.resume=off"
                ) from None
            if not isinstance(rec, dict):
                raise MetricsFileError(f"{path}, line {number}: a record must be a JSON object")
            records.append(rec)
    return records


def _to_json(value: Any) -> Any:
    item = getattr(value, "item", None)  # numpy / torch scalars
    return item() if callable(item) else str(value)


class JsonlSink:
    """Appends records to one JSONL file; see the module docstring."""

    def __init__(self, path: Path) -> None:
        self.path = path
        drop_torn_tail(path)  # the next record must not be glued to half a line
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
