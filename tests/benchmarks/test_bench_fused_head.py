"""Smoke of benchmarks/fused_head.py at tiny sizes: both heads run and the result file has a time and a peak
for each (no time bound: the figures are in benchmarks/results)."""

from __future__ import annotations

from pathlib import Path

from bench_smoke import finite_positive, run_smoke


def test_fused_head_smoke(tmp_path: Path) -> None:
    result = run_smoke("fused_head.py", tmp_path)
    summary = result["summary"]
    assert finite_positive(summary["plain_ms"]) and finite_positive(summary["fused_block256_ms"])
    assert summary["logits_bytes_fp32"] == 96 * 1000 * 4
    assert [r["path"] for r in result["raw"]] == ["plain", "fused"]
