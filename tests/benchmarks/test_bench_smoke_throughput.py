"""CI smoke of the throughput benchmarks: each runs its `--smoke` workload and writes a well-formed result.

The figures themselves are not checked against any target or bound (the machine is shared: a matmul peak
measured while another process holds a core can come out below the step it is compared with), only that
every one was measured (finite, positive) and that the derived figures follow from the raw ones. A figure
over its peak is flagged in the result's `suspect` entries, which the report prints.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import finite_positive, run_smoke


def test_rollout_throughput_smoke(tmp_path: Path) -> None:
    record = run_smoke("rollout_throughput.py", tmp_path)
    summary, runs = record["summary"], record["raw"]["runs"]
    assert summary["params"] > 0
    assert record["settings"]["smoke"] is True
    assert {r["side"] for r in runs} >= {"engine", "generate"}
    assert all(finite_positive(r["tok_s"]) and r["tokens"] > 0 for r in runs)
    assert set(summary["by_dtype"]) == {"float32", "bfloat16"}
    for figures in summary["by_dtype"].values():
        assert finite_positive(figures["engine_tok_s"]) and finite_positive(figures["generate_tok_s"])
        assert finite_positive(figures["engine_over_generate"])
        assert finite_positive(figures["compute_bound_tok_s"]) and finite_positive(
            figures["matmul_peak_gflops"]
        )
        # the derived figures, recomputed from the raw ones: bound = peak / (2 x params) tokens per second
        bound = figures["matmul_peak_gflops"] * 1e9 / (2 * summary["params"])
        assert figures["compute_bound_tok_s"] == pytest.approx(bound)
        fraction = figures["engine_tok_s"] / bound
        assert figures["engine_fraction_of_compute_bound"] == pytest.approx(fraction)
        assert ("suspect" in figures) == (fraction > 1)
    if summary["vllm"] is None:  # run under .venv: the reason is said
        assert summary["vllm_reason"]
    else:
        assert all(finite_positive(f["vllm_tok_s"]) for f in summary["by_dtype"].values())


def test_train_throughput_smoke(tmp_path: Path) -> None:
    record = run_smoke("train_throughput.py", tmp_path)
    summary, raw = record["summary"], record["raw"]
    assert finite_positive(summary["matmul_peak_gflops"]["float32"])
    assert finite_positive(summary["matmul_peak_gflops"]["bfloat16"])
    assert set(summary["sizes"]) == set(raw) == {"1M"}
    for label, size in summary["sizes"].items():
        assert size["params"] > 0 and size["tokens_per_step"] > 0
        for precision in ("float32", "bfloat16"):
            rounds = raw[label]["rounds"][precision]
            assert rounds["train_s"] and rounds["logprob_s"] and rounds["peak_gflops"]
            assert all(finite_positive(v) for values in rounds.values() for v in values)
            figures = size[precision]
            for key in ("best_step_s", "train_tok_s", "gflops", "logprob_tok_s"):
                assert finite_positive(figures[key]), key
            # the derived figures, recomputed from the raw rounds: 6 x params x tokens FLOPs in the best step
            step = min(rounds["train_s"])
            assert figures["best_step_s"] == step
            gflops = 6 * size["params"] * size["tokens_per_step"] / step / 1e9
            assert figures["gflops"] == pytest.approx(gflops)
            for dtype, key in (("float32", "mfu_fp32"), ("bfloat16", "mfu_bf16")):
                peak = max(raw[label]["rounds"][dtype]["peak_gflops"])
                assert summary["matmul_peak_gflops"][dtype] == peak
                assert figures[key] == pytest.approx(gflops / peak)
        over = [p for p, key in (("float32", "mfu_fp32"), ("bfloat16", "mfu_bf16")) if size[p][key] > 1]
        assert len(size.get("suspect", [])) == len(over)  # a step over its own peak is flagged, not failed
