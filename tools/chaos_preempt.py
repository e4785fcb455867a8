"""The chaos soak's `preempt` fault: the driver preempted as SLURM or Kubernetes would, with SIGTERM.

`tools/chaos_soak.py` finds the driver as for its `driver` fault (the pid `run_state.json` names, checked to
be the soak's own child) and sends SIGTERM instead of SIGKILL. Here the driver must then, by itself:

- log its `preemption: SIGTERM received ...` line (the fault's name, and when it was named);
- exit within the run's grace (`trainer.preempt_grace_s`, the default 120 s) plus `MARGIN_S`, with
  `trainer.preempt_exit_code` (75);
- leave a `preempt` record whose step is the run's `latest` checkpoint (the step it was on, saved).

The fault counts as named when the driver has exited that way (`named_after_s`: signal to exit). A miss is
written into the fault's row (`preempt_check`) and leaves the fault unnamed, which fails the soak.
The run is then resumed as a scheduler's requeue would (`trainer.resume=auto`); the soak's end checks (every
step trained once, every prompt drawn once per epoch in the sampler's order) show that nothing was lost.
"""

from __future__ import annotations

import time
from typing import Any

from chaos_checks import latest_checkpoint
from chaos_procs import kill_all
from chaos_runs import records_since
from chaos_targets import first_match

__all__ = ["EXIT_CODE", "GRACE_S", "MARGIN_S", "PATTERN", "after_preempt"]

GRACE_S = 120.0
"""`trainer.preempt_grace_s` of the soak's run (the default)."""
EXIT_CODE = 75
"""`trainer.preempt_exit_code` of the soak's run (the default)."""
MARGIN_S = 30.0
"""Room past the grace for the interpreter's own exit on a loaded machine."""
PATTERN = r"preemption: SIGTERM received"


def after_preempt(
    soak: Any, row: dict[str, Any], start: int, wall: float
) -> tuple[float | None, str | None, float]:
    """After SIGTERM to `soak.driver` at Unix time `wall` (its log had `start` lines): wait for its own
    exit, check code, line and record into `row`, resume the run. (named time, message, restart time)."""
    driver = soak.driver
    sent = time.monotonic()
    exited = driver.wait(GRACE_S + MARGIN_S)
    exit_after = time.monotonic() - sent
    if not exited:
        kill_all([driver.pid])
        driver.wait(30)
    line = first_match(driver.log_lines(), start, PATTERN)
    records = [r for r in records_since(soak.run_dir, wall) if r.get("kind") == "preempt"]
    rec = records[0] if records else None
    latest = latest_checkpoint(soak.run_dir)
    check = {
        "passed": exited
        and driver.returncode() == EXIT_CODE
        and line is not None
        and rec is not None
        and rec.get("step") == latest,
        "exit": driver.returncode(),
        "exit_after_s": round(exit_after, 2),
        "record": rec,
        "latest": latest,
    }
    row["preempt_check"] = check
    row["driver_exit"] = driver.returncode()
    soak.fault_start = start
    since = soak.restart()
    if not check["passed"]:
        return None, f"failed: {check}", since
    return sent + exit_after, line, since  # named: the driver's own exit, its line and record written
