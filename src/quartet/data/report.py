"""What loading a prompt dataset did with its rows: counts by outcome, and every row it skipped, named."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quartet.data.bad_rows import BadRow
from quartet.data.errors import DataError

__all__ = ["DatasetReport"]


@dataclass
class DatasetReport:
    """What loading did with each row."""

    files: tuple[str, ...] = ()
    rows: int = 0
    """Rows read."""
    loaded: int = 0
    """Rows kept (truncated ones included)."""
    filtered_overlong: int = 0
    """Rows dropped for a prompt longer than `max_prompt_length`."""
    truncated: int = 0
    """Rows whose prompt was cut to its last `max_prompt_length` tokens."""
    bad_rows: dict[str, int] = field(default_factory=dict)
    """Malformed rows skipped, by reason (only with `skip_bad_rows`; otherwise the first one raises)."""
    first_bad: dict[str, str] = field(default_factory=dict)
    """The first skipped row's message, by reason."""
    longest_prompt: int = 0
    """Longest kept prompt, in tokens (after truncation)."""
    bad: list[BadRow] = field(default_factory=list)
    """Every skipped, over-long-filtered or truncated row, named (file, row, field, reason)."""
    seconds: float = 0.0
    """Time spent reading, checking and tokenizing."""

    @property
    def skipped(self) -> int:
        """Malformed rows skipped, all reasons."""
        return sum(self.bad_rows.values())

    def as_dict(self) -> dict[str, Any]:
        """The counts as plain data (for logs and trackers)."""
        return {
            "files": list(self.files),
            "rows": self.rows,
            "loaded": self.loaded,
            "filtered_overlong": self.filtered_overlong,
            "truncated": self.truncated,
            "bad_rows": dict(self.bad_rows),
            "longest_prompt": self.longest_prompt,
            "seconds": round(self.seconds, 3),
        }

    def summary(self) -> str:
        """One line of counts."""
        bad = ", ".join(f"{k} {v}" for k, v in sorted(self.bad_rows.items())) or "none"
        return (
            f"{self.rows} rows read, {self.loaded} loaded, {self.filtered_overlong} over-long filtered, "
            f"{self.truncated} truncated, bad rows skipped: {bad}; longest prompt {self.longest_prompt} "
            f"tokens; {self.seconds:.2f}s"
        )

    def _count_bad(self, error: DataError, reason: str) -> None:
        self.bad_rows[reason] = self.bad_rows.get(reason, 0) + 1
        self.first_bad.setdefault(reason, str(error))
        self._name(error, reason)

    def _name(self, error: DataError, reason: str) -> None:
        self.bad.append(
            BadRow("load", error.file, error.row, error.column, reason, error.problem, line=error.line)
        )
