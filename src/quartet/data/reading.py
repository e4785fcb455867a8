"""Rows of data files: parquet, JSON Lines, or a folder written by HF `datasets` (`save_to_disk`).

The format is chosen from the path: `.parquet`; `.jsonl` / `.json` (one JSON object per line, or one JSON
array of objects); a folder holding `state.json` and `*.arrow` files (a saved `datasets.Dataset`); any other
folder is read as its `.parquet` / `.jsonl` / `.json` files in name order (a downloaded hub repository's
`data/` folder). Several paths are read one after the other, as one concatenated table.

Every row carries its `RowSource` (file, 0-based data row, and for JSON Lines the 1-based line), so a
problem found much later (a template failure, a missing ground truth) still points at the row to fix.

Text that is not valid UTF-8 (a parquet string cell, a JSONL line) makes that row a `RowProblem`
(`invalid_utf8`, naming the column and the byte), so `data.skip_bad_rows` skips it like any malformed row;
JSON is read with `surrogateescape` so one bad byte spoils only its row, not the file.

A saved `datasets` folder is read with pyarrow alone: its arrow files are Arrow IPC streams that pyarrow
reads directly, so the `datasets` package is not needed (nor imported when installed). A `DatasetDict`
folder (several splits) is refused with the list of its splits: the user names the split folder.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from quartet.data.errors import DataError, RowProblem

__all__ = ["DataFormat", "RowSource", "SourcedRow", "detect_format", "read_files", "read_rows"]

_FILE_SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}
_KNOWN = "parquet (.parquet), JSON Lines (.jsonl, .json) or a folder written by datasets' save_to_disk"
_PARQUET_BATCH_ROWS = 4096  # rows converted to Python at a time: bounds memory on large files
_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")  # what `surrogateescape` makes of a byte that is not UTF-8


class DataFormat(StrEnum):
    """How a path is read."""

    PARQUET = "parquet"
    JSONL = "jsonl"  # also a `.json` file holding one array of objects
    HF_DATASET = "hf_dataset"  # a folder written by `datasets.Dataset.save_to_disk`
    FOLDER = "folder"  # a folder of parquet / JSON Lines files


@dataclass(frozen=True)
class RowSource:
    """Where a row came from."""

    file: str
    """The file (for a saved `datasets` folder: its arrow file)."""

    row: int
    """0-based data row within the file (blank JSONL lines are not rows)."""

    line: int | None = None
    """1-based line of a JSON Lines file; None for other formats."""

    def error(self, problem: RowProblem, hint: str = "") -> DataError:
        """`problem` located at this row; `hint` is added to its fix (e.g. how to skip such rows)."""
        return problem.at(self.file, self.row, self.line, hint)


@dataclass(frozen=True)
class SourcedRow:
    """One row and its source. `value` is the row's columns, or a `RowProblem` when it could not be parsed
    (a JSONL line that is not a JSON object): the caller decides whether that stops the run or is counted."""

    source: RowSource
    value: dict[str, Any] | RowProblem


def detect_format(path: str | Path) -> DataFormat:
    """The format of `path`, from its suffix or folder content; `DataError` when unknown or missing."""
    p = Path(path)
    if p.is_dir():
        if (p / "dataset_dict.json").exists():
            splits = sorted(d.name for d in p.iterdir() if d.is_dir())
            raise DataError(
                str(p),
                f"this folder holds a DatasetDict with splits {splits}, not one dataset",
                fix=f"name one split folder, e.g. {p / splits[0]}" if splits else "name one split folder",
            )
        if (p / "state.json").exists() or any(p.glob("*.arrow")):
            return DataFormat.HF_DATASET
        return DataFormat.FOLDER
    if not p.exists():
        raise DataError(str(p), f"does not exist (resolved to {p.resolve()})", fix="check the path")
    kind = _FILE_SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise DataError(str(p), f"unknown data format '{p.suffix}'", fix=f"use {_KNOWN}")
    return DataFormat(kind)


def read_rows(path: str | Path) -> Iterator[SourcedRow]:
    """Every row of `path` (a file or folder, see the module docstring) with its source."""
    fmt = detect_format(path)
    p = Path(path)
    if fmt is DataFormat.PARQUET:
        yield from _parquet_rows(p)
    elif fmt is DataFormat.JSONL:
        yield from _json_rows(p)
    elif fmt is DataFormat.HF_DATASET:
        for arrow in _arrow_files(p):
            yield from _arrow_rows(arrow)
    else:
        files = sorted(f for f in p.iterdir() if f.is_file() and f.suffix.lower() in _FILE_SUFFIXES)
        if not files:
            raise DataError(str(p), "folder holds no data files", fix=f"point to {_KNOWN}")
        for f in files:
            yield from read_rows(f)


def read_files(paths: Iterable[str | Path]) -> Iterator[SourcedRow]:
    """The rows of several paths, concatenated in the order given."""
    paths = list(paths)
    for p in paths:  # fail on a wrong path before any work is done on the others
        detect_format(p)
    for p in paths:
        yield from read_rows(p)


def _check_object(value: Any) -> dict[str, Any] | RowProblem:
    if isinstance(value, dict):
        return value
    return RowProblem(
        "not_an_object", "", f"a row must be a JSON object of columns, got {type(value).__name__}"
    )


def _parquet_rows(path: Path) -> Iterator[SourcedRow]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        reader = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(str(path), f"not a readable parquet file: {err}") from err
    row = 0
    for batch in reader.iter_batches(batch_size=_PARQUET_BATCH_ROWS):
        for value in _batch_rows(batch):
            yield SourcedRow(RowSource(str(path), row), value)
            row += 1


def _batch_rows(batch: Any) -> list[dict[str, Any] | RowProblem]:
    """An Arrow record batch's rows as dicts; a row holding text that is not UTF-8 is a `RowProblem`
    naming the column (pyarrow's own error names neither row nor column)."""
    try:
        rows: list[dict[str, Any] | RowProblem] = batch.to_pylist()
        return rows
    except UnicodeDecodeError:
        pass
    names = batch.schema.names
    out: list[dict[str, Any] | RowProblem] = []
    for i in range(batch.num_rows):
        fields: dict[str, Any] = {}
        problem: RowProblem | None = None
        for j, name in enumerate(names):
            try:
                fields[name] = batch.column(j)[i].as_py()
            except UnicodeDecodeError as err:
                bad = err.object[err.start : err.start + 1].hex()
                problem = RowProblem(
                    "invalid_utf8",
                    name,
                    f"the text is not valid UTF-8 (byte 0x{bad} at byte {err.start} of the value)",
                    "re-encode the file as UTF-8, or fix or drop the row",
                )
                break
        out.append(fields if problem is None else problem)
    return out


def _utf8_problem(value: Any, column: str = "") -> RowProblem | None:
    """A `RowProblem` naming the first field (e.g. `prompt[0].content`) holding a byte that was not UTF-8
    (read with `surrogateescape`), else None."""
    if isinstance(value, str):
        found = _ESCAPED_BYTE.search(value)
        if found is None:
            return None
        byte = ord(found.group()) - 0xDC00
        return RowProblem(
            "invalid_utf8",
            column,
            f"the text is not valid UTF-8 (byte 0x{byte:02x} at character {found.start()} of the value)",
            "re-encode the file as UTF-8, or fix or drop the row",
        )
    items: Iterable[tuple[str, Any]] = ()
    if isinstance(value, dict):
        items = ((f"{column}.{k}" if column else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{column}[{i}]", v) for i, v in enumerate(value))
    for name, item in items:
        problem = _utf8_problem(name, column) if _ESCAPED_BYTE.search(name) else _utf8_problem(item, name)
        if problem is not None:
            return problem
    return None


def _checked(value: Any, escaped: bool) -> dict[str, Any] | RowProblem:
    """A parsed JSON row, or its problem: not an object, or text that was not UTF-8 (looked for only when
    `escaped`: its raw text held an escaped byte)."""
    if escaped:
        problem = _utf8_problem(value)
        if problem is not None:
            return problem
    return _check_object(value)


def _json_rows(path: Path) -> Iterator[SourcedRow]:
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        head = fh.read(4096).lstrip()
        fh.seek(0)
        if head.startswith("["):  # one JSON array of row objects
            try:
                text = fh.read()
                bad = _ESCAPED_BYTE.search(text) is not None
                values = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataError(str(path), f"not valid JSON ({err.msg})", line=err.lineno) from err
            if not isinstance(values, list):
                raise DataError(str(path), f"expected an array of row objects, got {type(values).__name__}")
            for i, item in enumerate(values):
                yield SourcedRow(RowSource(str(path), i), _checked(item, bad))
            return
        row = 0
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            value: dict[str, Any] | RowProblem
            try:
                value = _checked(json.loads(line), _ESCAPED_BYTE.search(line) is not None)
            except json.JSONDecodeError as err:
                value = RowProblem("invalid_json", "", f"not valid JSON ({err.msg} at column {err.colno})")
            yield SourcedRow(RowSource(str(path), row, line_no), value)
            row += 1


def _arrow_files(folder: Path) -> list[Path]:
    """The arrow files of a saved dataset, in the order its `state.json` lists them."""
    state = folder / "state.json"
    if state.exists():
        try:
            names = [entry["filename"] for entry in json.loads(state.read_text())["_data_files"]]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise DataError(str(state), f"not a datasets state file ({type(err).__name__}: {err})") from err
        files = [folder / name for name in names]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise DataError(str(folder), f"state.json lists arrow files that are missing: {missing}")
        return files
    return sorted(folder.glob("*.arrow"))


def _arrow_rows(path: Path) -> Iterator[SourcedRow]:
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        try:  # `datasets` writes IPC streams; accept the IPC file format too
            reader: Any = pa.ipc.open_stream(source)
            batches: Iterable[Any] = reader
        except pa.ArrowInvalid:
            source.seek(0)
            try:
                file_reader = pa.ipc.open_file(source)
            except pa.ArrowInvalid as err:
                raise DataError(str(path), f"not an Arrow IPC file: {err}") from err
            batches = (file_reader.get_batch(i) for i in range(file_reader.num_record_batches))
        row = 0
        for batch in batches:
            for value in _batch_rows(batch):
                yield SourcedRow(RowSource(str(path), row), value)
                row += 1
