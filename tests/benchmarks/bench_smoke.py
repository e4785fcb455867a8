"""What the benchmark smoke tests share (conftest puts `benchmarks/` on the path): a `--smoke` run in a
fresh interpreter whose result is validated, and a check that a figure was measured (finite, positive)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import validate_result

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run_smoke(script: str, out_dir: Path, timeout_s: float = 300) -> dict[str, Any]:
    """Run `benchmarks/<script> --smoke --out-dir out_dir` in a fresh interpreter; its validated result."""
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", "--out-dir", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=BENCH.parent,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    name = script.removesuffix(".py")
    return validate_result(out_dir / f"{name}.json", name)


def finite_positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0
