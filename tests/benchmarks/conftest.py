"""The benchmark scripts are not a package: `benchmarks/` and `benchmarks/peers/` go on the path, as when a
script runs (`python benchmarks/NAME.py` puts its own folder first)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
for folder in (BENCH, BENCH / "peers"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
