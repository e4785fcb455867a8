"""The console sink: compact lines with the expected numbers, a progress bar only on a terminal."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from quartet.tracking import Tracking
from quartet.tracking.console_sink import ConsoleSink, format_data, format_record, format_step, format_val

STEP = {
    "kind": "step",
    "step": 7,
    "critic/score/mean": 0.123456,
    "response_length/mean": 31.26,
    "actor/pg_loss": -0.5,
    "actor/ppo_kl": 2e-5,
    "timing_s/step": 1.234,
    "perf/throughput": 4321.7,
    "critic/score/max": 1.0,  # not in the compact line
}
VAL = {
    "kind": "val",
    "step": 10,
    "val-core/arithmetic/reward/mean@1": 0.75,
    "val-core/gsm8k/reward/mean@4": 0.5,
}


def test_step_and_val_lines() -> None:
    assert format_step(STEP) == (
        "step    7  score 0.123  len 31.3  pg_loss -0.5000  ppo_kl +0.0000  step_s 1.23  tok/s 4322"
    )
    assert format_val(VAL) == "val  step   10  arithmetic/reward/mean@1 0.750  gsm8k/reward/mean@4 0.500"
    assert format_step({"step": 1, "critic/score/mean": "n/a"}) == "step    1  score n/a"


def test_data_line_counts_rows() -> None:
    rec = {
        "kind": "data",
        "train": {"rows": 10, "loaded": 8, "filtered_overlong": 2, "bad_rows": {}},
        "val": None,
    }
    assert format_data(rec) == "data  train 10 rows (8 loaded, 2 overlong)  val none"


def test_alarm_lines_of_both_alarms() -> None:
    mismatch = {"kind": "alarm", "step": 2, "alarm": "mismatch", "phase": "recompute"}
    mismatch |= {"alarm/mismatch_value": 0.0118, "alarm/mismatch_threshold": 0.0003}
    assert format_record(mismatch) == "alarm  step 2  mismatch (recompute)  0.0118 > 0.0003"
    silent = {"kind": "alarm", "step": 5, "alarm": "no_signal", "phase": "rewards"}
    silent["alarm/no_signal_steps"] = 5
    assert format_record(silent) == "alarm  step 5  no_signal (rewards)  for 5 steps"


def test_lines_only_when_not_a_terminal(tmp_path: Path) -> None:
    out = io.StringIO()
    console = Console(file=out, width=40, highlight=False)  # narrower than the lines
    with Tracking(["console"], tmp_path, "quartet", "t", {}, total_steps=20, console=console) as tracking:
        tracking.phase("gen")
        tracking.log(STEP)
        tracking.log(VAL)
    assert out.getvalue().splitlines() == [format_step(STEP), format_val(VAL)]  # no bar, no redraws


def test_progress_bar_shows_step_and_phase_on_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    sink = ConsoleSink(total_steps=20, start_step=6, console=console)
    sink.phase("gen")
    assert "step 7/20 · gen" in out.getvalue()
    sink.log(STEP)
    sink.phase("update_actor")
    sink.close()
    text = out.getvalue()
    assert "step 8/20 · update_actor" in text
    assert format_step(STEP) in text
    assert "done: 7/20 steps" in text.rsplit("\r", 1)[-1]  # the bar's last state
    sink.close()  # idempotent
