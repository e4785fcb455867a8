"""The chaos soak, short: one round of the cheap faults against a real async run on its own local Ray, then
every end check (`tools/chaos_soak.py`; the hour-long run's results are benchmarks/results/chaos_soak.json).

Slow (a few Ray starts: ~4 minutes on a busy 2-core machine), so `-m slow` only. The kinds that need root
(disk_full: a tmpfs) or a phase deadline short enough to race a loaded machine (hang) are left to the long
run; the hang watchdog has its own tests in tests/cluster/test_watchdog.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["reward_worker", "actor_host", "torn_metrics", "preempt"]


def test_a_round_of_faults_is_named_recovered_and_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    argv = [sys.executable, str(ROOT / "tools" / "chaos_soak.py"), "--minutes", "0", "--seed", "0"]
    argv += ["--kinds", ",".join(KINDS), "--gap-min", "3", "--gap-max", "6", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1100, env=env, cwd=tmp_path)
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert done.returncode == 0, json.dumps(result, indent=1)[-4000:] + done.stderr[-2000:]
    assert sorted({f["kind"] for f in result["faults"]}) == sorted(KINDS)  # each kind injected
    for fault in result["faults"]:
        assert fault["named_after_s"] is not None and fault["message"], fault
        assert fault["recovered_after_s"] is not None, fault
    assert result["unprovoked_failures"] == []
    checks = result["checks"]
    assert set(checks) == {"final_run", "steps", "prompts", "orphans", "leftover_files", "sync_bitwise"}
    assert {name: check["passed"] for name, check in checks.items()} == dict.fromkeys(checks, True)
    assert checks["steps"]["steps"] >= 3 and checks["steps"]["missing"] == []
    assert checks["prompts"]["prompts"] == 4 * checks["steps"]["steps"]  # distinct prompts: 4 a step
    assert checks["sync_bitwise"]["tensors_differing"] == []
    assert 0 < checks["sync_bitwise"]["killed_after_step"] < 6
    assert result["finished"] and result["passed"]
