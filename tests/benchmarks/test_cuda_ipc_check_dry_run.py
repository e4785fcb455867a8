"""The CUDA IPC check's dry run (benchmarks/gpu/cuda_ipc_check.py --dry-run): the lead runs the script on a
GPU machine; here the same two-process protocol runs over host shared memory at tiny shapes, so a broken
script shows in CI rather than in a device run. Slow: two processes importing torch, ~25 s on 2 busy cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "cuda_ipc_check.py"


@pytest.mark.slow
def test_the_dry_run_pushes_three_versions_bitwise(tmp_path: Path) -> None:
    out = tmp_path / "cuda_ipc.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["transport"] == "shm" and record["all_bitwise_equal"] is True
    assert [v["version"] for v in record["versions"]] == [1, 2, 3]
    for version in record["versions"]:
        assert version["bitwise_equal"] is True
        # payload = the parameters' bytes plus alignment gaps (< 64 bytes per tensor)
        assert record["bytes"] <= version["bytes"] < record["bytes"] + 64 * 40
        assert version["buckets"] > 2  # the tiny bucket bound really splits the stream
    assert record["nccl_two_ranks_one_gpu"]["outcome"].startswith("skipped")
