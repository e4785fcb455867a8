"""Rows a run could not use, each named: `<run dir>/bad_rows.jsonl`, one JSON object per line.

Loading skips malformed rows (with `data.skip_bad_rows`) and drops or cuts over-long prompts; scoring turns
a failed or timed-out reward call into 0. Counts alone do not say which row to fix, so every such row is
written here with its file, 0-based row (and JSONL line), the field and the reason:

    {"stage": "load", "file": "train.jsonl", "row": 7, "line": 8, "field": "data_source",
     "reason": "unknown_data_source", "message": "no rule scorer for data_source 'gsm9k'; ..."}
    {"stage": "reward", "step": 3, "file": "train.parquet", "row": 12, "field": "reward",
     "reason": "error", "message": "the score function raised ..."}

Each start of a run rewrites the `load` lines (a resumed run loads the same files again) and keeps the
`reward` lines of earlier processes; the run's log names the file with a summary. The file's name is
`quartet.tracking.run_layout.BAD_ROWS_FILE`; the trainer passes the path.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["BadRow", "append_bad_rows", "replace_load_rows"]


@dataclass(frozen=True)
class BadRow:
    """One row that was skipped, cut, or failed to score."""

    stage: str
    """`load` (reading and checking the data) or `reward` (scoring a response of the row)."""
    file: str
    """The data file the row came from."""
    row: int | None
    """0-based data row within the file (None when the file as a whole is at fault)."""
    field: str
    """The column at fault (`prompt`, `data_source`, ...); `reward` for scoring failures."""
    reason: str
    """A short stable label: `unknown_data_source`, `invalid_utf8`, `overlong_filtered`, `error`, ..."""
    message: str
    """What is wrong, in words."""
    line: int | None = None
    """1-based line of a JSON Lines file."""
    step: int | None = None
    """The training step (reward failures only)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields that are known, as plain data."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def append_bad_rows(path: Path, rows: list[BadRow]) -> None:
    """Append `rows` to the JSON Lines file `path` (created with its folder when missing)."""
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row.as_dict(), ensure_ascii=False) + "\n")


def replace_load_rows(path: Path, rows: list[BadRow]) -> None:
    """`path` with its `load` lines replaced by `rows`; its other lines (reward failures) are kept."""
    kept: list[str] = []
    if path.exists():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                stage = json.loads(line).get("stage")
            except (json.JSONDecodeError, AttributeError):
                continue  # a torn line of an interrupted write: rewritten below
            if stage != "load":
                kept.append(line)
    if not kept and not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r.as_dict(), ensure_ascii=False) + "\n" for r in rows)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "".join(line + "\n" for line in kept), encoding="utf-8")
    tmp.replace(path)
