"""The tracker run id of a run folder, kept in a small file so a resumed run continues the same tracker run.

Written when a sink creates its run; read back only when the run resumes (`start_step > 0`), so a fresh run
in an old folder starts a fresh tracker run.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["read_run_id", "write_run_id"]


def _path(run_dir: Path, tracker: str) -> Path:
    return run_dir / f".{tracker}-run-id"


def read_run_id(run_dir: Path, tracker: str, start_step: int) -> str | None:
    """The saved id when resuming and one was saved, else None."""
    path = _path(run_dir, tracker)
    if start_step <= 0 or not path.is_file():
        return None
    return path.read_text().strip() or None


def write_run_id(run_dir: Path, tracker: str, run_id: str) -> None:
    _path(run_dir, tracker).write_text(run_id + "\n")
