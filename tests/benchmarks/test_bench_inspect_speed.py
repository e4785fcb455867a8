"""Smoke of benchmarks/inspect_speed.py on a small step: it writes, serves and reads the synthetic run.

No time bound is held here (the figures live in benchmarks/results/inspect_speed.json); what is checked is
that every measured request ran and that the table it wrote has the shape it was asked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "benchmarks" / "inspect_speed.py"


def test_inspect_speed_smoke(tmp_path: Path) -> None:
    out = tmp_path / "inspect.json"
    cmd = [
        sys.executable,
        str(BENCH),
        "--samples",
        "64",
        "--tokens",
        "16",
        "--repeat",
        "1",
        "--out",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["samples"] == 64 and result["max_tokens"] == 16 and result["file_mb"] > 0
    for key in (
        "list_seconds",
        "filtered_sorted_list_seconds",
        "sample_with_tokens_seconds",
        "group_seconds",
    ):
        assert 0 < result[key] < 60, key
