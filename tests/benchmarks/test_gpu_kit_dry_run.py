"""The GPU kit's dry run (benchmarks/gpu/kit.py --dry-run): every check runs on the CPU at tiny sizes, with
Ray unimportable (the kit must run from a working-tree copy on a torch-only GPU machine), and writes JSON
whose figures follow from each other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KIT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "kit.py"
NO_RAY = """
import importlib.abc, runpy, sys
class NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("ray is not installed on this machine")
sys.meta_path.insert(0, NoRay())
sys.argv = [sys.argv[1], "--dry-run", "--out", sys.argv[2]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_the_kit_dry_run_passes_without_ray(tmp_path: Path) -> None:
    out = tmp_path / "kit.json"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(KIT), str(out)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    checks = record["checks"]
    assert record["dry_run"] is True and list(checks) == [
        "build_model",
        "update_and_planner",
        "rollout_builtin",
        "vllm_sleep",
        "weight_sync",
        "grpo_steps",
        "gpu_tests",
    ]
    assert {name: c["status"] for name, c in checks.items() if c["status"] != "pass"} == {
        "vllm_sleep": "skip",  # CUDA only
        "gpu_tests": "skip",  # no CUDA here
    }
    update = checks["update_and_planner"]
    assert len(update["losses"]) == 3 and update["planned_update_bytes"] > 0
    tokens = 4 * (16 + 16)  # the dry run's rows x (prompt + response)
    assert update["update_tokens_per_s"] == pytest.approx(tokens / min(update["step_seconds"][1:]), rel=0.01)
    assert checks["rollout_builtin"]["tokens"] == 4 * 8
    assert checks["grpo_steps"]["steps"] == 2 and "timing_s/gen" in checks["grpo_steps"]["timing_last_step"]
    assert checks["weight_sync"]["figures"]["bytes"] > 0


@pytest.mark.slow
def test_the_decode_profile_dry_run_times_every_decode_step(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    script = KIT.parent / "decode_profile.py"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = json.loads(out.read_text())["runs"]
    # 8 rows of 16 new tokens: the prefill samples the first token, then 15 decode steps
    assert run["cuda_graphs"] is False and run["decode_steps"] == 15
    assert set(run["parts_ms"]) == {"forward", "sample", "append"}
    assert 0 < run["parts_ms"]["forward"] <= run["step_ms"] * 1.5


@pytest.mark.slow
def test_the_compiled_graph_decode_dry_run_matches_the_eager_step(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    done = subprocess.run(
        [sys.executable, "-c", NO_RAY, str(KIT.parent / "graph_compile.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["graphs"] is False and record["rows"] == 4  # the CPU has no graphs: both run eagerly
    assert record["max_logit_difference"] < 1e-4  # inductor's float32 forward is the eager one
    assert record["compile_and_capture_s"] > 0
