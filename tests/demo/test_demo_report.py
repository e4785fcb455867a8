"""What the demo prints around its table: the expected time and what a run can show before it starts, a
table that keeps its title and cells in an 80-column log, and the smoke warning under a `--quick` table."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from quartet.cli.demo import _report
from quartet.demo import DEMOS, MOE, DemoResult, DemoRow
from quartet.demo.expectations import (
    EXPECTATIONS,
    MOE_STEP_RATIO,
    closing_note,
    expectation,
    opening_note,
)

ROOT = Path(__file__).resolve().parents[2]
LONG = "/home/a-user/projects/quartet/runs/demo-seed0/sft_control/hf"


def _printed(result: DemoResult) -> str:
    out = io.StringIO()
    console = Console(file=out, width=80, highlight=False, emoji=False)  # a log file: not a terminal
    console.soft_wrap = True  # as `command_console` sets it off a terminal
    _report(console, result, seed=0)
    return out.getvalue()


def test_a_model_other_than_the_default_heads_the_title_on_its_own_line(tmp_path: Path) -> None:
    model = "tiny Qwen3-MoE: 1.05M of 3.41M parameters active"
    rows = [DemoRow(name, 0.5, 100, 200, 10.0, LONG) for name in ("SFT start", "GRPO", "more SFT (control)")]
    out = io.StringIO()
    console = Console(file=out, width=80, highlight=False, emoji=False)
    console.soft_wrap = True
    _report(console, DemoResult(rows=rows, run_dir=tmp_path, seconds=1.0), seed=0, model=model)
    lines = [line.strip() for line in out.getvalue().splitlines()]
    title = lines.index(model)
    assert lines[title + 1] == "greedy accuracy on 200 held-out problems (seed 0)"
    assert all(len(line) <= 80 for line in out.getvalue().splitlines()[: title + 8])


def test_the_table_fits_a_log_and_the_folders_follow_in_full(tmp_path: Path) -> None:
    rows = [
        DemoRow("SFT start", 0.685, 137, 200, 170.4, LONG.replace("sft_control", "sft_start")),
        DemoRow("GRPO", 0.955, 191, 200, 146.0, LONG.replace("sft_control", "grpo")),
        DemoRow("more SFT (control)", 0.87, 174, 200, 146.2, LONG),
    ]
    text = _printed(DemoResult(rows=rows, run_dir=tmp_path, seconds=700.0))
    assert "…" not in text
    assert "greedy accuracy on 200 held-out problems (seed 0)" in text
    lines = text.splitlines()
    for row in rows:
        (line,) = [x for x in lines if x.startswith("│ " + row.name + " ")]
        cells = [c.strip() for c in line.strip("│").split("│")]
        assert cells == [row.name, f"{row.accuracy:.1%}", f"{row.correct}/200", f"{row.train_seconds:.0f} s"]
        assert len(line) <= 80
        assert any(x.startswith(row.name + " model:") and x.endswith(row.model_dir) for x in lines)


@pytest.mark.parametrize(
    ("task", "model"), [*((task, "dense") for task in sorted(DEMOS)), *((task, "moe") for task in MOE)]
)
def test_every_cpu_demo_states_its_time_and_a_quick_one_says_it_is_a_smoke(task: str, model: str) -> None:
    full, quick = expectation(task, False, model=model), expectation(task, True, model=model)
    assert full is not None and quick is not None and 0 < quick.seconds < full.seconds
    assert opening_note(task, False, model=model).startswith(f"expected: {full.duration()} on a 2-core CPU")
    assert closing_note(task, False, model=model) is None  # the full table is the comparison
    assert "cannot show" in opening_note(task, True, model=model)
    closing = closing_note(task, True, model=model)
    assert closing is not None and "says nothing about which row is better" in closing
    command = "quartet demo" if task == "arithmetic" else f"quartet demo --task {task}"
    command += "" if model == "dense" else f" --model {model}"
    assert f"{command} ({full.duration()}) does." in closing


def test_the_gpu_demo_says_its_time_is_an_estimate() -> None:
    assert expectation("arithmetic", False, "gpu") is None
    assert "not yet timed" in opening_note("arithmetic", False, "gpu")


def test_the_moe_demo_times_follow_from_the_dense_ones_and_the_recorded_cost_ratio() -> None:
    """`--model moe`'s estimated times are the dense demo's times the larger MoE / dense update time that
    benchmarks/moe_cost.py recorded (GRPO's update or an SFT step)."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "moe_cost.json").read_text())
    ratios = recorded["summary"]["moe_over_dense"]
    ratio = max(ratios["update_s"], ratios["small_update_s"])
    assert round(ratio, 2) == MOE_STEP_RATIO
    for quick in (False, True):
        dense, moe = EXPECTATIONS[("arithmetic", quick, "dense")], EXPECTATIONS[("arithmetic", quick, "moe")]
        if moe.measured.startswith("estimated"):
            assert moe.seconds == 5 * round(dense.seconds * MOE_STEP_RATIO / 5)
            assert str(MOE_STEP_RATIO) in moe.measured


def test_the_measured_times_are_those_the_benchmark_recorded() -> None:
    """An expectation that names `benchmarks/demo_times.py` holds the wall time it wrote (to 5 s)."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "demo_times.json").read_text())
    measured = {(r["task"], r["quick"], r.get("model", "dense")): r["seconds"] for r in recorded["raw"]}
    for key, found in EXPECTATIONS.items():
        if found.measured == "benchmarks/demo_times.py":
            assert key in measured, f"{key} names benchmarks/demo_times.py, which did not measure it"
            assert found.seconds == 5 * round(measured[key] / 5), key
