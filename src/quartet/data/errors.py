"""The exception of the data layer: a file or row that cannot be used, and where it is."""

from __future__ import annotations

__all__ = ["DataError", "RowProblem"]


class DataError(ValueError):
    """A data file or row that cannot be used.

    It names the file, the 0-based data row (and the 1-based line for JSONL), the column, what is wrong and,
    when known, the fix (often a config key to set), so a user can go straight to the offending row.
    """

    def __init__(
        self,
        file: str,
        problem: str,
        *,
        row: int | None = None,
        column: str = "",
        fix: str = "",
        line: int | None = None,
    ) -> None:
        self.file = file
        self.problem = problem
        self.row = row
        self.column = column
        self.fix = fix
        self.line = line
        super().__init__(self._render())

    @property
    def where(self) -> str:
        """`file, row 3 (line 4), column 'prompt'` (the parts that are known)."""
        parts = [self.file]
        if self.row is not None:
            parts.append(f"row {self.row}" + (f" (line {self.line})" if self.line is not None else ""))
        elif self.line is not None:
            parts.append(f"line {self.line}")
        if self.column:
            parts.append(f"column '{self.column}'")
        return ", ".join(parts)

    def _render(self) -> str:
        text = f"{self.where}: {self.problem}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text


class RowProblem(ValueError):
    """What is wrong with one row, before its file and row number are attached (see `DataError`).

    `reason` is a short stable label used to count skipped rows (for example `missing_column`).
    """

    def __init__(self, reason: str, column: str, problem: str, fix: str = "") -> None:
        self.reason = reason
        self.column = column
        self.problem = problem
        self.fix = fix
        super().__init__(f"{column}: {problem}")

    def at(self, file: str, row: int, line: int | None = None, hint: str = "") -> DataError:
        """The same problem as a `DataError` located at (file, row); `hint` is appended to the fix."""
        fix = "; ".join(part for part in (self.fix, hint) if part)
        return DataError(file, self.problem, row=row, column=self.column, fix=fix, line=line)
