"""benchmarks/demo_times.py's items and `--merge`: a run is keyed by task, size and model (runs recorded
before `--model` existed are dense), and merging keeps exactly the recorded runs a call does not repeat."""

from __future__ import annotations

import json
from pathlib import Path

from demo_times import earlier_runs, key


def _run(task: str, quick: bool, model: str | None = None, seconds: float = 1.0) -> dict[str, object]:
    run: dict[str, object] = {"task": task, "quick": quick, "seconds": seconds, "rows": []}
    return run if model is None else {**run, "model": model}


def test_runs_are_keyed_by_task_size_and_model() -> None:
    assert key(_run("arithmetic", True)) == "arithmetic:quick"  # recorded before --model: dense
    assert key(_run("arithmetic", True, "dense")) == "arithmetic:quick"
    assert key(_run("arithmetic", False, "moe")) == "arithmetic:full:moe"


def test_merge_keeps_the_runs_a_call_does_not_repeat(tmp_path: Path) -> None:
    recorded = [_run("arithmetic", True), _run("vision", True), _run("arithmetic", True, "moe", 9.0)]
    path = tmp_path / "demo_times.json"
    path.write_text(json.dumps({"raw": recorded}))
    kept = earlier_runs({"arithmetic:quick:moe", "calculator:quick"}, path)
    assert [key(r) for r in kept] == ["arithmetic:quick", "vision:quick"]
    assert earlier_runs(set(), tmp_path / "missing.json") == []
