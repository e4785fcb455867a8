"""Checkpoint manifests: written last by the checkpoint writer over real DCP shards; a flipped byte or a
truncated shard is named (file, expected, found) and the resume falls back to the previous checkpoint; a
checkpoint without a manifest is used with a warning."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from quartet.trainer.recovery.checkpoint import (
    CheckpointError,
    TrainerState,
    choose_resume_checkpoint,
    find_resume_checkpoint,
    save_checkpoint,
)

LOGGER = "quartet.trainer.recovery.checkpoint"
SHARD = "actor/model/__0_0.distcp"


def _weights(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return {"w": torch.randn(64, 64, generator=gen), "b": torch.randn(64, generator=gen)}


def _save(run_dir: Path, step: int) -> Path:
    """A checkpoint of `step` by the run's writer, its actor a real DCP shard (as the engines write it)."""

    def roles(folder: Path) -> list[str]:
        dcp.save({"model": _weights(step)}, checkpoint_id=folder / "actor" / "model")
        return ["actor"]

    state = TrainerState(step, {"pos": step}, {}, float(step), 1, "model")
    return save_checkpoint(run_dir, state, "cfg: 1\n", roles, keep=0)


def _load(folder: Path) -> dict[str, torch.Tensor]:
    out = {"model": {"w": torch.zeros(64, 64), "b": torch.zeros(64)}}
    dcp.load(out, checkpoint_id=folder / "actor" / "model")
    return out["model"]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run with checkpoints after steps 2 and 4; `latest` names step 4."""
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    return tmp_path


def _ckpt(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"global_step_{step}"


def test_the_manifest_lists_every_file_with_its_size_and_sha256(run_dir: Path) -> None:
    folder = _ckpt(run_dir, 4)
    manifest = json.loads((folder / "manifest.json").read_text())
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    assert manifest["format"] == 1 and manifest["step"] == 4
    assert set(manifest["files"]) == on_disk and SHARD in on_disk and "trainer_state.json" in on_disk
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    assert not list(folder.glob(".*.tmp"))  # the temporary file was renamed in


def test_a_flipped_byte_is_named_and_the_resume_falls_back(
    run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = _ckpt(run_dir, 4) / SHARD
    data = bytearray(shard.read_bytes())
    expected = hashlib.sha256(data).hexdigest()
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        choice = choose_resume_checkpoint("auto", run_dir)
    assert choice.checkpoint == _ckpt(run_dir, 2)
    (bad,) = choice.rejected
    (problem,) = bad.problems
    assert (problem.file, problem.what, problem.expected) == (SHARD, "sha256", expected)
    assert problem.found == hashlib.sha256(data).hexdigest()
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert f"{SHARD}: sha256 expected {expected}" in log and "resuming from global_step_2" in log
    torch.testing.assert_close(_load(choice.checkpoint), _weights(2), rtol=0, atol=0)  # the fallback loads


def test_a_truncated_shard_is_named_by_its_size(run_dir: Path) -> None:
    shard = _ckpt(run_dir, 4) / SHARD
    size = shard.stat().st_size
    os.truncate(shard, size - 100)
    choice = choose_resume_checkpoint("auto", run_dir)
    assert choice.checkpoint == _ckpt(run_dir, 2)
    assert [str(p) for p in choice.rejected[0].problems] == [
        f"{SHARD}: size expected {size} bytes, found {size - 100} bytes"
    ]


def test_a_missing_file_is_named_and_an_explicit_bad_checkpoint_is_refused(run_dir: Path) -> None:
    config = _ckpt(run_dir, 4) / "config.yaml"
    size = config.stat().st_size
    config.unlink()
    assert find_resume_checkpoint("auto", run_dir) == _ckpt(run_dir, 2)
    with pytest.raises(CheckpointError, match=f"config.yaml: missing expected {size} bytes, found no file"):
        find_resume_checkpoint(str(_ckpt(run_dir, 4)), run_dir)


def test_every_checkpoint_bad_is_an_error_naming_each(run_dir: Path) -> None:
    for step in (2, 4):
        os.truncate(_ckpt(run_dir, step) / SHARD, 10)
    with pytest.raises(CheckpointError) as err:
        find_resume_checkpoint("auto", run_dir)
    assert "global_step_4: " in str(err.value) and "global_step_2: " in str(err.value)
    assert "trainer.resume=off" in str(err.value)


def test_a_checkpoint_without_a_manifest_is_used_with_one_warning(
    run_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (_ckpt(run_dir, 4) / "manifest.json").unlink()  # as written before manifests existed
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert find_resume_checkpoint("auto", run_dir) == _ckpt(run_dir, 4)
    (message,) = [r.getMessage() for r in caplog.records]
    assert "global_step_4: no manifest.json" in message and "\n" not in message
