"""W&B sink, offline: the history rows read back from the offline run file, the config, the run id."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import pytest

from quartet.tracking import Tracking

pytest.importorskip("wandb", reason="the tracking extra (wandb) is not installed")


def _history(path: Path) -> list[dict[str, Any]]:
    """History rows of an offline `run-*.wandb` file.

    wandb 0.31 ships no reader, so this one is written here: the file is a 7-byte header then LevelDB-log
    records (32 KiB blocks, 7-byte chunk headers: crc u32, length u16, type u8 = full 1 / first 2 /
    middle 3 / last 4) holding `wandb_internal_pb2.Record` protobufs.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, head = path.read_bytes(), 32768, 7
    pos, pending, rows = head, b"", []
    while pos + head <= len(data):
        if block - pos % block < head:  # block tail padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + head])
        if kind == 0:
            break
        pending += data[pos + head : pos + head + length]
        pos += head + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


def _rows_once_written(path: Path, expected: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """The history rows of `path` once `expected` of them are there (or whatever is there at the timeout).

    wandb's service process writes the offline file on its own schedule: on a busy machine `finish()` has
    been seen to return before the history records reached the file (0 rows read back), so the test waits
    for the writer instead of assuming it is done."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            history = _history(path)
        except Exception:  # a record being written as it is read: read again, unless time is up
            if time.monotonic() > deadline:
                raise
            history = []
        rows = [{k: v for k, v in r.items() if not k.startswith("_") or k == "_step"} for r in history]
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_offline_run_logs_metrics_and_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"algorithm": {"adv_estimator": "grpo"}}
    with Tracking(["wandb"], tmp_path, "quartet", "exp", config, total_steps=2) as tracking:
        tracking.log({"kind": "val", "step": 0, "val-core/arith/reward/mean@1": 0.0})
        tracking.log({"kind": "step", "step": 1, "critic/score/mean": 0.5})
        tracking.log({"kind": "step", "step": 2, "critic/score/mean": 0.25, "tag": "text"})
        tracking.log({"kind": "val", "step": 2, "val-core/arith/reward/mean@1": 0.125})
        run = wandb.run
        assert run is not None
        assert (run.name, run.project) == ("exp", "quartet")
        assert run.config["algorithm"] == {"adv_estimator": "grpo"}
    assert wandb.run is None  # finished on close
    (folder,) = (tmp_path / "wandb").glob("offline-run-*")
    (data,) = folder.glob("run-*.wandb")
    rows = _rows_once_written(data, expected=3)
    assert rows == [
        {"_step": 0, "val-core/arith/reward/mean@1": 0.0},
        {"_step": 1, "critic/score/mean": 0.5},
        {"_step": 2, "critic/score/mean": 0.25, "val-core/arith/reward/mean@1": 0.125},  # one row per step
    ]
    assert (tmp_path / ".wandb-run-id").read_text().strip() == run.id
