"""The driver's side of an elastic resume: a checkpoint written on another world size or layout is loaded
(not refused), with one warning line that names both worlds and what is not carried exactly; a checkpoint
written before layouts were recorded is compared by world size alone."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path

import pytest

from quartet.tracking.run_layout import TRAINER_STATE_FILE
from quartet.trainer.recovery.checkpoint import TrainerState, layout_label, load_trainer_state

DP2_SP2 = {"dp": 2, "sp": 2, "tp": 1, "ep": 1}
DP4 = {"dp": 4, "sp": 1, "tp": 1, "ep": 1}


def _written(folder: Path, world: int, layout: dict[str, int]) -> Path:
    state = TrainerState(5, {"epoch": 0, "position": 20}, {"value": 0.1}, 9.0, world, "model", layout=layout)
    (folder / TRAINER_STATE_FILE).write_text(json.dumps(asdict(state)))
    return folder


def test_another_layout_is_loaded_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = _written(tmp_path, 4, DP2_SP2)
    with caplog.at_level(logging.WARNING, "quartet.trainer.recovery.checkpoint"):
        state = load_trainer_state(folder, 4, DP4)
    assert state.step == 5 and state.sampler == {"epoch": 0, "position": 20} and state.layout == DP2_SP2
    (line,) = [r.getMessage() for r in caplog.records]
    assert "from 4 rank(s) (dp2 x sp2) to 4 rank(s) (dp4)" in line
    assert (
        "sampler position and KL controller carried exactly" in line
        and "not carried exactly: nothing" in line
    )


def test_another_world_size_names_the_ranks_not_carried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _written(tmp_path, 1, {"dp": 1, "sp": 1, "tp": 1, "ep": 1})
    with caplog.at_level(logging.WARNING, "quartet.trainer.recovery.checkpoint"):
        load_trainer_state(folder, 2, {"dp": 2, "sp": 1, "tp": 1, "ep": 1})
        load_trainer_state(_written(tmp_path, 2, {}), 1, {"dp": 1, "sp": 1, "tp": 1, "ep": 1})
    grown, shrunk = [r.getMessage() for r in caplog.records]
    assert (
        "from 1 rank(s) (dp1) to 2 rank(s) (dp2)" in grown
        and "of ranks [1] seeded from (seed, step, rank)" in grown
    )
    assert "from 2 rank(s) to 1 rank(s) (dp1)" in shrunk and "of ranks [1] dropped" in shrunk


def test_the_same_world_says_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "quartet.trainer.recovery.checkpoint"):
        load_trainer_state(_written(tmp_path, 4, DP4), 4, DP4)
        load_trainer_state(_written(tmp_path, 4, {}), 4, DP4)  # an older checkpoint: no layout recorded
    assert not caplog.records
    assert layout_label(4, DP2_SP2) == "4 rank(s) (dp2 x sp2)"
