"""The JSONL sink through `Tracking`: records read back as logged, flushed at once, appended on resume."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from quartet.tracking import Tracking


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _tracking(run_dir: Path, start_step: int = 0, loggers: tuple[str, ...] = ()) -> Tracking:
    return Tracking(loggers, run_dir, "quartet", "t", {"a": 1}, total_steps=4, start_step=start_step)


def test_records_read_back_as_logged_and_flushed_before_close(tmp_path: Path) -> None:
    records: list[dict[str, Any]] = [
        {"kind": "data", "train": {"rows": 8, "bad_rows": {}}, "val": None},
        {"kind": "val", "step": 0, "val-core/arith/reward/mean@1": 0.25},
        {"kind": "step", "step": 1, "critic/score/mean": 0.5, "actor/ppo_kl": -1e-5, "note": "text"},
        {"kind": "step", "step": 2, "time": 123.0, "critic/score/mean": 0.75},
    ]
    tracking = _tracking(tmp_path)  # jsonl is written although `loggers` is empty
    before = time.time()
    stored = [tracking.log(rec) for rec in records]
    on_disk = _read(tmp_path / "metrics.jsonl")  # before close: every record is already flushed
    tracking.close()
    assert on_disk == stored
    assert [{k: v for k, v in got.items() if k != "time"} for got in on_disk] == [
        {k: v for k, v in rec.items() if k != "time"} for rec in records
    ]
    assert [list(got)[:2] for got in on_disk[:3]] == [["kind", "time"]] * 3  # the trainer's old layout
    assert all(before <= got["time"] <= time.time() for got in on_disk[:3])
    assert on_disk[3]["time"] == 123.0  # a given time is kept


def test_nan_is_kept(tmp_path: Path) -> None:
    with _tracking(tmp_path) as tracking:
        tracking.log({"kind": "step", "step": 1, "x": float("nan")})
    assert math.isnan(_read(tmp_path / "metrics.jsonl")[0]["x"])


def test_resume_appends_and_a_closed_tracking_refuses_records(tmp_path: Path) -> None:
    with _tracking(tmp_path) as first:
        first.log({"kind": "step", "step": 1, "x": 1.0})
        first.log({"kind": "step", "step": 2, "x": 2.0})
    with _tracking(tmp_path, start_step=2) as resumed:
        resumed.log({"kind": "step", "step": 3, "x": 3.0})
    assert [(r["step"], r["x"]) for r in _read(tmp_path / "metrics.jsonl")] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    resumed.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        resumed.log({"kind": "step", "step": 4})


def test_numpy_scalars_are_written_as_numbers(tmp_path: Path) -> None:
    import numpy as np

    with _tracking(tmp_path) as tracking:
        tracking.log({"kind": "step", "step": np.int64(1), "x": np.float32(0.5)})
    assert _read(tmp_path / "metrics.jsonl")[0]["x"] == 0.5
