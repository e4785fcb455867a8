"""benchmarks/distillation.py: its budget clock and validation reading checked against sums and records
written here, and a CI smoke (`--smoke`: a tiny teacher and start, one seed, every arm) whose result holds
each arm's curve from the start, the teacher's signal in the distillation arm only, and an SFT set that is
the training prompts' first rows with the teacher's answers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from bench_smoke import finite_positive, run_smoke
from distillation import ARMS, StopAtSeconds, val_accuracy


def test_the_budget_clock_sums_step_times_and_stops_at_the_budget() -> None:
    times = [0.4, 0.7, 0.2, 0.9, 0.3]
    stop = StopAtSeconds(budget=1.5)
    stops = []
    for step, t in enumerate(times, start=1):
        stop.on_record({"kind": "step", "step": step, "timing_s/step": t})
        stops.append(stop.should_stop(step, step))
    # cumulative 0.4, 1.1, 1.3, 2.2, 2.5: the first at or past 1.5 is step 4
    assert stops == [False, False, False, True, True]
    assert stop.seconds_at[3] == pytest.approx(0.4 + 0.7 + 0.2)
    assert stop.reverse_kl == []
    stop.on_record({"kind": "val", "step": 3, "val-core/arithmetic/reward/mean@1": 0.25, "val-aux/x": 9.0})
    assert stop.evals == [(3, 0.25)]


def test_a_validation_record_without_one_reward_mean_is_refused() -> None:
    with pytest.raises(ValueError, match="one reward mean expected"):
        val_accuracy({"kind": "val", "step": 1, "val-aux/arithmetic/length": 3.0})


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a hang guard only: ~1 min on a quiet 2-core machine, ~5 on a shared one
def test_distillation_smoke(tmp_path: Path) -> None:
    result = run_smoke("distillation.py", tmp_path, timeout_s=1200)
    raw, settings = result["raw"], result["settings"]
    start = raw["student"]["accuracy"]
    (seed,) = raw["seeds"]
    for arm in ARMS:
        run = seed["arms"][arm]
        curve = run["curve"]
        assert curve[0] == {"seconds": 0.0, "step": 0, "accuracy": start}
        secs = [p["seconds"] for p in curve]
        assert secs == sorted(secs) and all(0.0 <= p["accuracy"] <= 1.0 for p in curve)
        assert run["final_accuracy"] == curve[-1]["accuracy"]
        assert result["summary"][arm]["final_accuracy"] == [run["final_accuracy"]]
    for arm in ("distill", "grpo"):  # stopped by the clock: at or past the budget, after >= 1 step
        run = seed["arms"][arm]
        assert run["train_seconds"] >= settings["budget"] and run["steps"] >= 1
    kl = seed["arms"]["distill"]["reverse_kl"]
    assert len(kl) == seed["arms"]["distill"]["steps"] and all(math.isfinite(v) and v != 0.0 for v in kl)
    assert seed["arms"]["grpo"]["reverse_kl"] == []  # no teacher, no signal
    data = raw["teacher_set"]
    assert data["rows"] == settings["sft_prompts"] and finite_positive(data["sample_seconds"])
    rows = pq.read_table(data["file"]).to_pylist()
    train = pq.read_table(tmp_path / "distillation_work" / "data" / "arithmetic" / "rl_train.parquet")
    prompts = train.to_pylist()[: settings["sft_prompts"]]
    assert [r["messages"][:-1] for r in rows] == [p["prompt"] for p in prompts]
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)
    saved = json.loads((Path(raw["teacher"]["folder"]) / "teacher.json").read_text())
    assert saved == raw["teacher"]  # the cache a second run reads
