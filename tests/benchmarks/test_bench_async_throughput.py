"""CI smoke of benchmarks/async_throughput.py: the separate-pool sync and async modes train from the same
SFT start and are scored (the smoke runs these two ends of the comparison; the other modes have their own
tests in tests/trainer/).

Throughput is not held to any bound here (a shared machine; the figures live in benchmarks/results/). What is
checked: both modes ran their 2 steps (the smoke counts steps, so a busy machine runs the same ones, only
slower: once it was a 3-second budget, and at load average 8 that was 1 step) and were scored on the same
held-out set, async reports its staleness and overlap, sync none, and the derived figures follow from the
raw ones. Time is bounded only by a hang guard far above what the smoke takes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import finite_positive, run_smoke


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a hang guard only: ~1-2 min on a quiet 2-core machine
def test_async_throughput_smoke(tmp_path: Path) -> None:
    record = run_smoke("async_throughput.py", tmp_path, timeout_s=1100)
    assert record["settings"]["train_steps"] == 2
    rows = {r["mode"]: r for r in record["raw"]}
    assert set(rows) == {"sync_separate", "async"}
    totals = {r["total"] for r in rows.values()}
    assert totals == {200}  # the same held-out problems for every mode
    for mode, row in rows.items():
        assert row["steps"] == 2, mode
        assert row["samples"] == row["steps"] * 32 * 8
        assert row["samples_per_s"] == pytest.approx(row["samples"] / row["train_s"])
        assert finite_positive(row["train_s"]) and 0 <= row["accuracy"] <= 1
    assert rows["sync_separate"]["staleness_mean"] is None and rows["sync_separate"]["overlap"] == 0.0
    assert 0 < rows["async"]["staleness_mean"] <= 2 and 0 <= rows["async"]["overlap"] <= 1
    summary = record["summary"]
    assert summary["sync_separate"]["ratio_to_sync_separate"] == pytest.approx(1.0)
    ratio = rows["async"]["samples_per_s"] / rows["sync_separate"]["samples_per_s"]
    assert summary["async"]["ratio_to_sync_separate"] == pytest.approx(ratio)
