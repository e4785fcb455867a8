"""`quartet doctor --run-dir`: each checkpoint of a run checked against its manifest (real DCP shards
written by the run's checkpoint writer), through the check list and through the command."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from quartet.cli.doctor_checkpoints import checkpoint_checks
from quartet.cli.main import main as quartet_main
from quartet.trainer.recovery.checkpoint import TrainerState, save_checkpoint

SHARD = "actor/model/__0_0.distcp"


def _save(run_dir: Path, step: int) -> Path:
    def roles(folder: Path) -> list[str]:
        weights = {"w": torch.full((32, 32), float(step))}
        dcp.save({"model": weights}, checkpoint_id=folder / "actor" / "model")
        return ["actor"]

    return save_checkpoint(run_dir, TrainerState(step, {}, {}, 0.0, 1, "model"), "cfg: 1\n", roles, keep=0)


def _ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"global_step_{step}"


def test_no_checkpoint_is_a_warning(tmp_path: Path) -> None:
    (check,) = checkpoint_checks(tmp_path)
    assert check.status == "warn" and "no complete checkpoint" in check.message


def test_doctor_reports_each_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path
    _save(run_dir, 2)
    _save(run_dir, 4)
    _save(run_dir, 6)
    shard = _ckpt(run_dir, 4) / SHARD
    size = shard.stat().st_size
    os.truncate(shard, size - 1)
    data = bytearray((_ckpt(run_dir, 6) / SHARD).read_bytes())
    data[0] ^= 0xFF
    (_ckpt(run_dir, 6) / SHARD).write_bytes(data)
    (_ckpt(run_dir, 2) / "manifest.json").unlink()

    checks = {c.name: c for c in checkpoint_checks(run_dir)}
    assert [c.status for c in checks.values()] == ["warn", "fail", "fail"]
    assert (
        f"{SHARD}: size expected {size} bytes, found {size - 1} bytes"
        in checks["checkpoint global_step_4"].message
    )
    assert f"{SHARD}: sha256 expected" in checks["checkpoint global_step_6"].message

    # the command itself: no Ray at the address (exit 2), the checkpoint checks in its JSON all the same
    argv = ["doctor", "--run-dir", str(run_dir), "--address", "127.0.0.1:9", "--no-smoke", "--json"]
    assert quartet_main(argv) == 2
    report = json.loads(capsys.readouterr().out)
    by_name = {c["name"]: c["status"] for c in report["checks"]}
    assert [by_name[f"checkpoint global_step_{s}"] for s in (2, 4, 6)] == ["warn", "fail", "fail"]

    # and as text: one line per checkpoint, the bad file named on its line
    assert quartet_main(argv[:-1]) == 2
    lines = capsys.readouterr().out.splitlines()
    (line4,) = [x for x in lines if "checkpoint global_step_4:" in x]
    assert "FAIL" in line4 and f"{SHARD}: size expected {size} bytes, found {size - 1} bytes" in line4
    (line2,) = [x for x in lines if "checkpoint global_step_2:" in x]
    assert "warn" in line2 and "no manifest.json" in line2
