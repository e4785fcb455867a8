"""Memory before and after a run: the plan checked (and fitted) before workers start, peaks measured after.

Before: `plan_run(cfg)` estimates the step's memory on one bundle (`quartet.planning`) against the free
memory of this machine (on CPU divided among the node's bundles, which share it). A run that does not fit
is refused with the proposal, or, with `trainer.auto_fit`, run with the proposal applied. A model whose
shape the planner cannot read (an architecture it does not know) is run unchecked, with a warning.

After: `measured_peaks(workers)` asks every actor rank for its process's peak resident memory (VmHWM) and,
on GPU, `torch.cuda.max_memory_allocated`; the trainer logs them next to the planned peak. The RSS peak
includes the interpreter and libraries (torch alone is a few hundred MiB), which the plan does not count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from quartet.config import QuartetConfig
from quartet.planning.fit import FitReport, detect_capacity, fit_config
from quartet.planning.model_shape import UnknownModelShapeError

__all__ = ["MemoryDoesNotFitError", "PlannedRun", "measured_peaks", "plan_run", "rank_peaks"]

log = logging.getLogger(__name__)


class MemoryDoesNotFitError(ValueError):
    """The run's planned memory exceeds the device's free memory (the message holds the proposal)."""


@dataclass(frozen=True)
class PlannedRun:
    """The config to run (fitted under `trainer.auto_fit`) and the plan it was checked with."""

    cfg: QuartetConfig
    report: FitReport | None
    """None when the check is off or the model's shape is unknown."""

    def record(self) -> dict[str, Any]:
        """The record the trainer logs (`kind: memory_plan`)."""
        if self.report is None:
            return {"checked": False}
        r = self.report
        plan = r.fitted_plan if r.fitted_plan is not None and self.cfg is r.fitted else r.plan
        return {
            "checked": True,
            "device": plan.device,
            "planned_peak_bytes": plan.peak_device,
            "planned_peak_host_bytes": plan.peak_host,
            "peak_phase": str(plan.peak_phase),
            "free_bytes": r.capacity.device_bytes,
            "applied": r.overrides if self.cfg is r.fitted else [],
        }


def plan_run(cfg: QuartetConfig) -> PlannedRun:
    """Check `cfg`'s memory before any worker starts (module docstring); raises MemoryDoesNotFitError."""
    if not cfg.trainer.memory_check:
        return PlannedRun(cfg, None)
    from quartet.planning.estimate import resolve_device

    kind = resolve_device(cfg)
    capacity = detect_capacity(kind)
    if kind == "cpu" and cfg.cluster.bundles_per_node > 1:  # the node's ranks share its memory
        share = capacity.device_bytes // cfg.cluster.bundles_per_node
        capacity = type(capacity)(
            "cpu", share, share, f"{capacity.source} / {cfg.cluster.bundles_per_node} bundles"
        )
    try:
        report = fit_config(cfg, device=kind, capacity=capacity)
    except UnknownModelShapeError as err:
        log.warning("memory not planned: %s", err)
        return PlannedRun(cfg, None)
    if report.fits:
        return PlannedRun(cfg, report)
    text = report.plan.render_table() + "\n" + report.render()
    if cfg.trainer.auto_fit and report.fitted is not None and report.fits_after:
        log.warning("trainer.auto_fit: the plan did not fit; running with %s", " ".join(report.overrides))
        return PlannedRun(report.fitted, report)
    hint = (
        "set trainer.auto_fit=true to apply the proposal, or pass its overrides"
        if report.fits_after and report.changes
        else "no config change makes it fit"
    )
    raise MemoryDoesNotFitError(
        f"the run does not fit this device's memory ({hint}; "
        f"trainer.memory_check=false skips this check):\n{text}"
    )


def rank_peaks(role: object) -> dict[str, int]:
    """This process's peak RSS and CUDA peak (run on a worker rank through `RoleGroup.execute`)."""
    from quartet.planning.measure import cuda_peak_bytes, peak_rss_bytes

    cuda = cuda_peak_bytes()
    return {"peak_rss_bytes": peak_rss_bytes(), "cuda_peak_bytes": -1 if cuda is None else cuda}


def measured_peaks(workers: Any) -> dict[str, float]:
    """Largest peaks over the actor's ranks (`memory/measured_*`)."""
    peaks = workers.actor.execute(rank_peaks)
    out = {"memory/measured_peak_rss_bytes": float(max(p["peak_rss_bytes"] for p in peaks))}
    cuda = max(p["cuda_peak_bytes"] for p in peaks)
    if cuda >= 0:
        out["memory/measured_cuda_peak_bytes"] = float(cuda)
    return out
