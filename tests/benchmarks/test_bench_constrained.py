"""Smoke of benchmarks/constrained_decoding.py: the three cases run the same work and are timed (no time
bound: the figures are in benchmarks/results)."""

from __future__ import annotations

from pathlib import Path

from bench_smoke import finite_positive, run_smoke


def test_constrained_decoding_smoke(tmp_path: Path) -> None:
    result = run_smoke("constrained_decoding.py", tmp_path)
    summary = result["summary"]
    assert all(finite_positive(summary[f"{case}_ms_per_step"]) for case in ("none", "one", "all"))
    assert result["raw"]["all"]["n"] == 1
