"""CI smoke of benchmarks/weight_sync.py: two real processes stream a model's weights over gloo.

Figures are not held to any bound (a shared machine); what is checked is that every sync moved all the
model's tensors (counted from the model itself), that the payload covers their bytes (alignment gaps aside),
and that the derived figures follow from the raw ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import finite_positive, run_smoke


# slow (CI time), like the other benchmark smokes: weight sync is held exact by tests/weight_sync
@pytest.mark.slow
def test_weight_sync_smoke(tmp_path: Path) -> None:
    record = run_smoke("weight_sync.py", tmp_path)
    summary, rows = record["summary"], record["raw"]
    assert record["settings"]["smoke"] is True and record["settings"]["bucket_mib"] == 1
    assert [r["version"] for r in rows] == [1, 2]
    for row in rows:
        assert row["tensors"] == summary["tensors"] > 0
        # payload = tensor bytes + alignment gaps (64 bytes at most per tensor)
        assert summary["tensor_bytes"] <= row["bytes"] <= summary["tensor_bytes"] + 64 * summary["tensors"]
        # the 8 MB embedding exceeds the 1 MiB cap and travels alone; the rest shares buckets
        assert 2 <= row["buckets"] < row["tensors"]
        assert finite_positive(row["sync_s"]) and finite_positive(row["plain_s"])
        assert row["sync_gb_s"] == pytest.approx(row["bytes"] / row["sync_s"] / 1e9)
        assert row["ratio"] == pytest.approx(row["sync_s"] / row["plain_s"])
    assert summary["bytes"] == rows[-1]["bytes"]
