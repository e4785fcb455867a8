"""CI smoke of the throughput benchmarks: each runs its `--smoke` workload and writes a well-formed result.

The figures themselves are not checked against any target (the machine is shared), only that every one was
measured: finite, positive tokens/s for every side, a parameter count, an MFU in a plausible range.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from common import validate_result  # noqa: E402


def run_smoke(script: str, out_dir: Path) -> dict[str, Any]:
    """Run `benchmarks/<script> --smoke --out-dir out_dir` in a fresh interpreter; its validated result."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", "--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCH.parent,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    name = script.removesuffix(".py")
    return validate_result(out_dir / f"{name}.json", name)


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


def test_rollout_throughput_smoke(tmp_path: Path) -> None:
    record = run_smoke("rollout_throughput.py", tmp_path)
    summary, runs = record["summary"], record["raw"]["runs"]
    assert summary["params"] > 0
    assert record["settings"]["smoke"] is True
    assert {r["side"] for r in runs} >= {"engine", "generate"}
    assert all(positive(r["tok_s"]) and r["tokens"] > 0 for r in runs)
    assert set(summary["by_dtype"]) == {"float32", "bfloat16"}
    for figures in summary["by_dtype"].values():
        assert positive(figures["engine_tok_s"]) and positive(figures["generate_tok_s"])
        assert positive(figures["engine_over_generate"])
        assert positive(figures["compute_bound_tok_s"]) and positive(figures["matmul_peak_gflops"])
        assert 0 < figures["engine_fraction_of_compute_bound"] < 1.5
    if summary["vllm"] is None:  # run under .venv: the reason is said
        assert summary["vllm_reason"]
    else:
        assert all(positive(f["vllm_tok_s"]) for f in summary["by_dtype"].values())


def test_train_throughput_smoke(tmp_path: Path) -> None:
    record = run_smoke("train_throughput.py", tmp_path)
    summary, raw = record["summary"], record["raw"]
    assert positive(summary["matmul_peak_gflops"]["float32"])
    assert positive(summary["matmul_peak_gflops"]["bfloat16"])
    assert set(summary["sizes"]) == set(raw) == {"1M"}
    for label, size in summary["sizes"].items():
        assert size["params"] > 0 and size["tokens_per_step"] > 0
        for precision in ("float32", "bfloat16"):
            rounds = raw[label]["rounds"][precision]
            assert rounds["train_s"] and rounds["logprob_s"] and rounds["peak_gflops"]
            assert all(positive(v) for values in rounds.values() for v in values)
            figures = size[precision]
            for key in ("best_step_s", "train_tok_s", "gflops", "logprob_tok_s"):
                assert positive(figures[key]), key
            assert 0 < figures["mfu_bf16"] < 1.5 and 0 < figures["mfu_fp32"] < 1.5
