"""The fp8 rollout tests: the shared rollout cases (`tests/rollout/rollout_cases.py`) on the path."""

from __future__ import annotations

import sys
from pathlib import Path

_ROLLOUT_TESTS = str(Path(__file__).resolve().parents[1] / "rollout")
if _ROLLOUT_TESTS not in sys.path:  # absent when only this folder is collected
    sys.path.insert(0, _ROLLOUT_TESTS)
