"""What the demo prints around its table: the expected time and what a run can show before it starts, a
table that keeps its title and cells in an 80-column log, and the smoke warning under a `--quick` table."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from quartet.cli.demo import _report
from quartet.demo import DEMOS, DemoResult, DemoRow
from quartet.demo.expectations import EXPECTATIONS, closing_note, expectation, opening_note

ROOT = Path(__file__).resolve().parents[2]
LONG = "/home/a-user/projects/quartet/runs/demo-seed0/sft_control/hf"


def _printed(result: DemoResult) -> str:
    out = io.StringIO()
    console = Console(file=out, width=80, highlight=False, emoji=False)  # a log file: not a terminal
    console.soft_wrap = True  # as `command_console` sets it off a terminal
    _report(console, result, seed=0)
    return out.getvalue()


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


@pytest.mark.parametrize("task", sorted(DEMOS))
def test_every_cpu_demo_states_its_time_and_a_quick_one_says_it_is_a_smoke(task: str) -> None:
    full, quick = expectation(task, False), expectation(task, True)
    assert full is not None and quick is not None and quick.seconds < full.seconds
    assert opening_note(task, False).startswith(f"expected: {full.duration()} on a 2-core CPU")
    assert closing_note(task, False) is None  # the full table is the comparison
    assert "cannot show" in opening_note(task, True)
    closing = closing_note(task, True)
    assert closing is not None and "says nothing about which row is better" in closing
    command = "quartet demo" if task == "arithmetic" else f"quartet demo --task {task}"
    assert f"{command} ({full.duration()}) does." in closing


def test_the_gpu_demo_says_its_time_is_an_estimate() -> None:
    assert expectation("arithmetic", False, "gpu") is None
    assert "not yet timed" in opening_note("arithmetic", False, "gpu")


def test_the_measured_times_are_those_the_benchmark_recorded() -> None:
    """An expectation that names `benchmarks/demo_times.py` holds the wall time it wrote (to 5 s)."""
    recorded = json.loads((ROOT / "benchmarks" / "results" / "demo_times.json").read_text())
    measured = {(r["task"], r["quick"]): r["seconds"] for r in recorded["raw"]}
    for key, found in EXPECTATIONS.items():
        if found.measured == "benchmarks/demo_times.py":
            assert key in measured, f"{key} names benchmarks/demo_times.py, which did not measure it"
            assert found.seconds == 5 * round(measured[key] / 5), key
