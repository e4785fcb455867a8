"""Smoke of benchmarks/tinker_sample_overhead.py: both sides run the same request and decode the same tokens
(no time bound: the figures are in docs/tinker.md). Slow (~20 s: a fresh interpreter builds the tiny model and
starts the service); tests/serving_tinker/test_tinker_sampling.py covers the sampling itself in CI."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import finite_positive, run_smoke


@pytest.mark.slow
def test_tinker_sample_overhead_smoke(tmp_path: Path) -> None:
    result = run_smoke("tinker_sample_overhead.py", tmp_path)
    summary = result["summary"]
    assert summary["same_tokens"] is True
    for case in ("sample_sdk", "sample_direct", "logprobs_sdk", "logprobs_direct"):
        assert finite_positive(summary[f"{case}_ms"])
        assert len(result["raw"][case]) == 2
