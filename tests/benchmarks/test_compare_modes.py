"""`benchmarks/gpu/compare_modes.py`: the one-GPU sync/async comparison read from two runs' metrics."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path
from types import ModuleType

import pytest

from quartet.config import load_config
from quartet.config.loader import to_yaml

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "compare_modes.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_modes", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, config: str, step_s: list[float], overlap: float | None) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(to_yaml(load_config(config)))
    records = [{"kind": "val", "step": 0}]
    for i, s in enumerate(step_s, start=1):
        rec = {"kind": "step", "step": i, "timing_s/step": s}
        if overlap is not None:
            rec["perf/overlap"] = overlap
        records.append(rec)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_the_comparison_takes_medians_after_the_warm_up_steps(tmp_path: Path) -> None:
    sync_steps, async_steps = [30.0, 9.0, 8.0, 10.0, 8.5], [40.0, 7.0, 5.0, 6.0, 5.5]
    sync = _run(tmp_path / "sync", "examples/single_gpu/sync.yaml", sync_steps, None)
    fast = _run(tmp_path / "async", "examples/single_gpu/async.yaml", async_steps, 0.4)
    out = tmp_path / "modes.json"
    assert _script().main([str(sync), str(fast), "--skip", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    first, second = result["runs"]
    samples = 32 * 8  # the examples' train_batch_size x rollout.n
    assert first["step_s_median"] == statistics.median(sync_steps[1:]) == 8.75
    assert second["samples_per_s"] == pytest.approx(samples / statistics.median(async_steps[1:]), abs=0.01)
    assert second["x_first"] == pytest.approx(8.75 / 5.75, abs=1e-3)
    assert second["perf/overlap"] == 0.4 and "perf/overlap" not in first
    assert first["steps"] == 5 and first["timed_steps"] == 4


def test_a_run_without_steps_is_named(tmp_path: Path) -> None:
    empty = _run(tmp_path / "empty", "examples/single_gpu/sync.yaml", [], None)
    with pytest.raises(ValueError, match="no step record"):
        _script().summarize(empty, 2)
