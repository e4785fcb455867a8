"""Smoke of benchmarks/moe_replay_grpo.py (1 seed, 2 steps, a tiny SFT start): both arms train from the same
warm start, so their first step samples the same responses; each run's curves hold one value per step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench_smoke import run_smoke


@pytest.mark.slow
def test_moe_replay_grpo_smoke(tmp_path: Path) -> None:
    result = run_smoke("moe_replay_grpo.py", tmp_path, timeout_s=600)
    runs = result["raw"]["runs"]
    assert set(runs) == {"replay_off-seed0", "replay_on-seed0"}
    for run in runs.values():
        curves = run["curves"]
        assert all(len(values) == result["settings"]["steps"] for values in curves.values())
        assert all(0.0 <= v <= 1.0 for v in curves["moe/routing_mismatch"])
        assert all(math.isfinite(v) and v > 0 for v in curves["rollout/logprob_diff_mean"])
    # Step 1: the same weights, seed and sampling in both arms; only the trainer's routing differs.
    for key in ("critic/score/mean", "response_length/mean"):
        first = [run["curves"][key][0] for run in runs.values()]
        assert first[0] == first[1], key
