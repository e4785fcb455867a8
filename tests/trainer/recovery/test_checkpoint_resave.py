"""Re-saving the step `latest` names (after resuming from an older checkpoint): a crash at any point of the
re-save leaves `trainer.resume=auto` a complete checkpoint, and the next save repairs what was left."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quartet.trainer.recovery.checkpoint import (
    CheckpointError,
    TrainerState,
    find_resume_checkpoint,
    list_checkpoints,
    save_checkpoint,
)


class Crash(RuntimeError):
    """The simulated kill."""


def _state(step: int) -> TrainerState:
    return TrainerState(step, {"pos": step}, {}, float(step), 1, "model")


def _save(run_dir: Path, step: int, tag: str) -> Path:
    def roles(folder: Path) -> list[str]:
        (folder / "actor").mkdir()
        (folder / "actor" / "weights").write_text(tag)
        return ["actor"]

    return save_checkpoint(run_dir, _state(step), "cfg: 1\n", roles, keep=0)


def _tag(folder: Path) -> str:
    return (folder / "actor" / "weights").read_text()


def _run_with_two_checkpoints(run_dir: Path) -> None:
    _save(run_dir, 2, "first-2")
    _save(run_dir, 4, "first-4")  # latest -> global_step_4


FS_CALLS = [("os", "rename"), ("os", "replace"), ("os", "remove"), ("shutil", "rmtree")]


class FileOps:
    """Counts the checkpoint module's renames, replaces, removals and deletions; raises `Crash` at call
    `crash_at`."""

    def __init__(self, mp: pytest.MonkeyPatch, crash_at: int | None = None) -> None:
        self.calls, self.crash_at = 0, crash_at
        for mod, name in FS_CALLS:
            module = os if mod == "os" else shutil  # the modules the checkpoint code calls them through
            mp.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            if self.calls - 1 == self.crash_at:
                raise Crash(f"killed at {name} (call {self.crash_at})")
            return original(*args, **kwargs)

        return call


def test_a_crash_at_every_point_of_a_resave_leaves_a_complete_checkpoint(tmp_path: Path) -> None:
    _run_with_two_checkpoints(tmp_path / "count")
    with pytest.MonkeyPatch.context() as mp:
        ops = FileOps(mp)
        _save(tmp_path / "count", 4, "second-4")
    points = ops.calls
    assert points >= 7  # marker, point latest away, set aside, rename in, point latest, delete old, marker
    for crash_at in range(points):
        run_dir = tmp_path / f"crash{crash_at}"
        _run_with_two_checkpoints(run_dir)
        with pytest.MonkeyPatch.context() as mp:
            FileOps(mp, crash_at)
            with pytest.raises(Crash):
                _save(run_dir, 4, "second-4")

        found = find_resume_checkpoint("auto", run_dir)  # no CheckpointError: something complete is found
        assert found is not None and (found / "trainer_state.json").exists(), crash_at
        # step 4 as it was or as it became, never step 2, where `latest` waited during the re-save (resuming
        # from it redid two steps)
        assert _tag(found) in ("first-4", "second-4"), crash_at
        assert (run_dir / "checkpoints" / "latest").read_text().strip() == "global_step_4", crash_at
        assert json.loads((found / "trainer_state.json").read_text())["step"] == int(found.name[12:])
        # step 4 survives the crash in one version or the other; nothing is left aside after the repair
        assert [p.name for p in list_checkpoints(run_dir)] == ["global_step_2", "global_step_4"], crash_at
        assert not list((run_dir / "checkpoints").glob(".old-*")), crash_at
        assert not list((run_dir / "checkpoints").glob(".resave-*")), crash_at
        again = _save(run_dir, 4, "third-4")  # and the run goes on
        assert _tag(again) == "third-4" and find_resume_checkpoint("auto", run_dir) == again


def test_latest_naming_a_missing_folder_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _run_with_two_checkpoints(tmp_path)
    shutil.rmtree(tmp_path / "checkpoints" / "global_step_4")
    with caplog.at_level(logging.WARNING, logger="quartet.trainer.recovery.checkpoint"):
        found = find_resume_checkpoint("auto", tmp_path)
    assert found == tmp_path / "checkpoints" / "global_step_2"
    (message,) = [r.getMessage() for r in caplog.records]
    assert "names 'global_step_4', which is missing or incomplete" in message
    assert "global_step_2" in message

    shutil.rmtree(tmp_path / "checkpoints" / "global_step_2")
    with pytest.raises(CheckpointError, match="no other complete checkpoint"):
        find_resume_checkpoint("auto", tmp_path)


def test_an_interrupted_resave_of_a_step_latest_does_not_name_leaves_latest_where_it_was(
    tmp_path: Path,
) -> None:
    """Resumed from step 2, the run saved step 3 (`latest`), then crashed re-saving step 4 (an earlier
    attempt's): the old step 4 is restored, and the run resumes from step 3, as before the re-save."""
    _run_with_two_checkpoints(tmp_path)
    _save(tmp_path, 3, "second-3")
    with pytest.MonkeyPatch.context() as mp:
        FileOps(mp, crash_at=2)  # 0: its manifest renamed in; 1: step 4 set aside; 2: the new one renamed in
        with pytest.raises(Crash):
            _save(tmp_path, 4, "second-4")
    assert (tmp_path / "checkpoints" / ".old-global_step_4").is_dir()
    found = find_resume_checkpoint("auto", tmp_path)
    assert found is not None and _tag(found) == "second-3"
    assert _tag(tmp_path / "checkpoints" / "global_step_4") == "first-4"
