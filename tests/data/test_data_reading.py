"""Reading rows from parquet, JSON Lines, saved `datasets` folders and folders of files, with sources."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quartet.data.errors import DataError, RowProblem
from quartet.data.reading import DataFormat, detect_format, read_files, read_rows


def _write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _save_like_datasets(folder: Path, shards: list[list[dict]]) -> Path:
    """The layout of `datasets.Dataset.save_to_disk`: Arrow IPC streams, state.json, dataset_info.json."""
    folder.mkdir(parents=True)
    names = []
    for i, rows in enumerate(shards):
        name = f"data-{i:05d}-of-{len(shards):05d}.arrow"
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        names.append({"filename": name})
    # state.json lists the shards in an order other than by name, to check that the listed order wins
    names.reverse()
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_split": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    return folder


def test_parquet_rows_know_file_and_row(tmp_path: Path) -> None:
    path = _write_parquet(tmp_path / "a.parquet", [{"x": i} for i in range(5)])
    rows = list(read_rows(path))
    assert [r.value for r in rows] == [{"x": i} for i in range(5)]
    assert [(r.source.file, r.source.row, r.source.line) for r in rows] == [
        (str(path), i, None) for i in range(5)
    ]
    assert detect_format(path) is DataFormat.PARQUET


def test_jsonl_rows_skip_blank_lines_and_keep_bad_lines_as_problems(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"x": 0}\n\n{"x": 1}\nnot json\n[1, 2]\n')
    rows = list(read_rows(path))
    assert [(r.source.row, r.source.line) for r in rows] == [(0, 1), (1, 3), (2, 4), (3, 5)]
    assert rows[0].value == {"x": 0} and rows[1].value == {"x": 1}
    assert isinstance(rows[2].value, RowProblem) and rows[2].value.reason == "invalid_json"
    assert isinstance(rows[3].value, RowProblem) and rows[3].value.reason == "not_an_object"


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"x": 0}, {"x": 1}], indent=2))
    assert [r.value for r in read_rows(path)] == [{"x": 0}, {"x": 1}]


def test_saved_datasets_folder_is_read_in_state_order(tmp_path: Path) -> None:
    folder = _save_like_datasets(tmp_path / "ds", [[{"x": 0}, {"x": 1}], [{"x": 2}]])
    assert detect_format(folder) is DataFormat.HF_DATASET
    rows = list(read_rows(folder))
    assert [r.value["x"] for r in rows] == [2, 0, 1]  # shard 1 is listed first in state.json
    assert rows[0].source.file.endswith("data-00001-of-00002.arrow") and rows[1].source.row == 0


def test_real_datasets_save_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets package is not installed")
    datasets.Dataset.from_list([{"x": i, "s": str(i)} for i in range(4)]).save_to_disk(tmp_path / "ds")
    assert [r.value for r in read_rows(tmp_path / "ds")] == [{"x": i, "s": str(i)} for i in range(4)]


def test_dataset_dict_folder_asks_for_a_split(tmp_path: Path) -> None:
    folder = tmp_path / "dd"
    _save_like_datasets(folder / "train", [[{"x": 0}]])
    _save_like_datasets(folder / "test", [[{"x": 0}]])
    (folder / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(DataError, match=r"splits \['test', 'train'\]") as err:
        list(read_rows(folder))
    assert str(folder / "test") in str(err.value)


def test_folder_of_files_and_several_paths_concatenate_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "parts"
    folder.mkdir()
    _write_parquet(folder / "b.parquet", [{"x": 2}])
    _write_parquet(folder / "a.parquet", [{"x": 0}, {"x": 1}])
    (folder / "notes.txt").write_text("ignored")
    extra = tmp_path / "c.jsonl"
    extra.write_text('{"x": 3}\n')
    rows = list(read_files([folder, extra]))
    assert [r.value["x"] for r in rows] == [0, 1, 2, 3]
    assert [Path(r.source.file).name for r in rows] == ["a.parquet", "a.parquet", "b.parquet", "c.jsonl"]


def test_unknown_or_missing_paths_fail_before_reading(tmp_path: Path) -> None:
    good = _write_parquet(tmp_path / "a.parquet", [{"x": 0}])
    (tmp_path / "a.csv").write_text("x\n0\n")
    with pytest.raises(DataError, match="unknown data format '.csv'"):
        list(read_files([good, tmp_path / "a.csv"]))
    with pytest.raises(DataError, match="does not exist"):
        list(read_files([good, tmp_path / "missing.parquet"]))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no data files"):
        list(read_rows(tmp_path / "empty"))
