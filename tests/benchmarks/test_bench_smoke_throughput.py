"""CI smoke of the throughput benchmarks: each runs its `--smoke` workload and writes a well-formed result.

The figures themselves are not checked against any target (the machine is shared), only that every one was
measured: finite, positive tokens/s for every side, a parameter count, an MFU in a plausible range.
"""

from __future__ import annotations

from pathlib import Path

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
        assert 0 < figures["engine_fraction_of_compute_bound"] < 1.5
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
            assert 0 < figures["mfu_bf16"] < 1.5 and 0 < figures["mfu_fp32"] < 1.5
