"""Smoke of benchmarks/moe_routing_replay.py at tiny sizes: both cases and both modes are measured and the
result file holds their figures (no bound on them: the figures are in benchmarks/results)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench_smoke import run_smoke


@pytest.mark.slow
def test_moe_routing_replay_smoke(tmp_path: Path) -> None:
    result = run_smoke("moe_routing_replay.py", tmp_path)
    for case in ("kit", "near_tied", "wide"):
        for mode in ("replay_off", "replay_on"):
            figures = result["raw"][case][mode]
            assert 0.0 <= figures["routing_mismatch"] <= 1.0
            assert all(math.isfinite(v) and v >= 0 for v in figures["abs_logprob_diff"].values())
