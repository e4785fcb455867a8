"""The rule of a phase's hang deadline: floor, factor of the longest earlier time, override, cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.cluster.watchdog import active_deadline
from quartet.config import load_config
from quartet.trainer.loop.step import StepRunner
from quartet.trainer.records.phase_timer import (
    HANG_FACTOR,
    HANG_FIRST_S,
    HANG_FLOOR_S,
    PhaseDeadlines,
    PhaseTimer,
)


def test_constants_are_the_documented_ones() -> None:
    assert (HANG_FIRST_S, HANG_FLOOR_S, HANG_FACTOR) == (1800.0, 600.0, 5.0)  # as the docs and config say


def test_automatic_deadline_floor_factor_and_cap(tmp_path: Path) -> None:
    deadlines = PhaseDeadlines(0.0, 3600.0, tmp_path)
    assert deadlines.timeout_s("gen") == 1800.0  # first step: no earlier time
    deadlines.record("gen", 100.0)
    assert deadlines.timeout_s("gen") == 600.0  # 5 x 100 = 500 < floor
    deadlines.record("gen", 200.0)
    deadlines.record("gen", 150.0)  # shorter than the longest: no change
    assert deadlines.timeout_s("gen") == 1000.0  # 5 x 200
    assert deadlines.timeout_s("update_actor") == 1800.0  # per phase: this one has no time yet
    deadlines.record("update_actor", 1.0)
    assert deadlines.timeout_s("update_actor") == 600.0  # 5 x 1 = 5 < floor
    deadlines.record("gen", 1000.0)
    assert deadlines.timeout_s("gen") == 3600.0  # 5 x 1000 capped by cluster.call_timeout_s
    capped = PhaseDeadlines(0.0, 300.0, tmp_path)
    assert capped.timeout_s("gen") == 300.0  # the cap is below the first-step deadline
    capped.record("gen", 1.0)
    assert capped.timeout_s("gen") == 300.0  # and below the floor


def test_override_wins_but_stays_under_the_cap(tmp_path: Path) -> None:
    deadlines = PhaseDeadlines(30.0, 3600.0, tmp_path)
    deadlines.record("gen", 1000.0)
    assert deadlines.timeout_s("gen") == 30.0
    assert PhaseDeadlines(7200.0, 3600.0, tmp_path).timeout_s("gen") == 3600.0


def test_timer_opens_the_phase_deadline_and_records_its_time(tmp_path: Path) -> None:
    deadlines = PhaseDeadlines(0.0, 3600.0, tmp_path)
    timer = PhaseTimer(guard=deadlines.guard(4))
    assert active_deadline() is None
    with timer("ref"):
        watch = active_deadline()
        assert watch is not None and (watch.phase, watch.step, watch.timeout_s) == ("ref", 4, 1800.0)
        assert watch.stacks_file == tmp_path / "hang_4.txt"
        with timer("inner"):  # nested: the one that passes first binds
            assert active_deadline() is watch
    assert active_deadline() is None
    assert set(deadlines.longest) == {"ref", "inner"} and "timing_s/ref" in timer.seconds
    with pytest.raises(ValueError), timer("ref"):
        raise ValueError("a failed phase records no time")
    assert active_deadline() is None


def test_step_runner_takes_its_deadlines_from_the_config() -> None:
    cfg = load_config(None, ["trainer.hang_timeout_s=5000", "cluster.call_timeout_s=4000"])
    runner = StepRunner(cfg, None, None, None)  # type: ignore[arg-type]  # the deadlines need no workers
    assert runner.deadlines.timeout_s("gen") == 4000.0
    assert runner.deadlines.run_dir == cfg.trainer.run_dir
