"""`plot_run(run_dir)`: a PNG of a run's curves from `<run dir>/metrics.jsonl`.

Panels over training steps: score (training mean with its min-max band, and the validation points of every
`val-core/<source>/reward/mean@N`), response length (mean, min-max band), KL (`actor/ppo_kl`,
`actor/kl_loss`, `critic/kl`: whichever the run has), entropy (`actor/entropy`) and the time of each step
phase stacked (`timing_s/*` except `timing_s/step`, drawn as a dashed total over the stack). A panel whose
metrics the run lacks says "no data". When a step appears twice (a resumed run replays the steps after its
checkpoint), the later record wins. A line that is not JSON (the half-written last line of a killed run)
is skipped with a warning.

Drawn with matplotlib's object API on an Agg canvas: no display needed and no global backend switched.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quartet.tracking.errors import require_module
from quartet.tracking.run_layout import METRICS_FILE, PLOTS_FILE
from quartet.tracking.sink import numeric_metrics, record_step

__all__ = ["RunCurves", "plot_run", "read_curves"]

log = logging.getLogger(__name__)

SCORE = "critic/score/mean"
LENGTH = "response_length/mean"
KL_KEYS = ("actor/ppo_kl", "actor/kl_loss", "critic/kl")
ENTROPY = "actor/entropy"
STEP_TIME = "timing_s/step"


@dataclass
class RunCurves:
    """Step and validation metrics of one run, one dict per step, in step order."""

    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    vals: dict[int, dict[str, float]] = field(default_factory=dict)

    def series(self, key: str, val: bool = False) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric, only the steps that have it."""
        source = self.vals if val else self.steps
        pairs = [(step, m[key]) for step, m in sorted(source.items()) if key in m]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def names(self, val: bool = False) -> list[str]:
        """Every metric name, in order of first appearance."""
        seen: dict[str, None] = {}
        for metrics in (self.vals if val else self.steps).values():
            seen.update(dict.fromkeys(metrics))
        return list(seen)


def read_curves(path: Path) -> RunCurves:
    """Step and val records of a metrics file; see the module docstring for duplicates and bad lines."""
    curves, bad = RunCurves(), 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            step = record_step(rec) if isinstance(rec, dict) else None
            if step is None or rec.get("kind") not in ("step", "val"):
                continue
            (curves.steps if rec["kind"] == "step" else curves.vals)[step] = numeric_metrics(rec)
    if bad:
        log.warning("%s: skipped %d line(s) that are not JSON", path, bad)
    return curves


def _no_data(ax: Any) -> None:
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey", fontsize=12)


def _band(ax: Any, curves: RunCurves, key: str, color: str) -> None:
    """min-max band of `<base>/min`..`<base>/max` around a `<base>/mean` line, when both exist."""
    base = key.removesuffix("/mean")
    lo = dict(zip(*curves.series(f"{base}/min"), strict=True))
    hi = dict(zip(*curves.series(f"{base}/max"), strict=True))
    steps = sorted(set(lo) & set(hi))
    if steps:
        ax.fill_between(steps, [lo[s] for s in steps], [hi[s] for s in steps], color=color, alpha=0.15)


def _lines(ax: Any, curves: RunCurves, keys: Sequence[str], band: bool = False) -> bool:
    drawn = False
    for key in keys:
        steps, values = curves.series(key)
        if steps:
            (line,) = ax.plot(steps, values, label=key, marker="." if len(steps) < 30 else None)
            if band:
                _band(ax, curves, key, line.get_color())
            drawn = True
    return drawn


def _score(ax: Any, curves: RunCurves) -> bool:
    drawn = _lines(ax, curves, [SCORE], band=True)
    for key in curves.names(val=True):
        if key.startswith("val-core/") and "/reward/mean@" in key:
            steps, values = curves.series(key, val=True)
            label = "val " + key.removeprefix("val-core/").replace("/reward/mean", " mean")
            ax.plot(steps, values, label=label, marker="o", linestyle="--")
            drawn = True
    return drawn


def _timing(ax: Any, curves: RunCurves) -> bool:
    keys = [k for k in curves.names() if k.startswith("timing_s/") and k != STEP_TIME]
    steps = sorted(s for s, m in curves.steps.items() if any(k in m for k in keys))
    if not steps:
        return False
    stacks = [[curves.steps[s].get(k, 0.0) for s in steps] for k in keys]
    ax.stackplot(steps, stacks, labels=[k.removeprefix("timing_s/") for k in keys], alpha=0.8)
    total_steps, totals = curves.series(STEP_TIME)
    if total_steps:
        ax.plot(total_steps, totals, color="black", linestyle="--", linewidth=1, label="step (total)")
    return True


_PANELS: tuple[tuple[str, str, Callable[[Any, RunCurves], bool]], ...] = (
    ("score", "score", _score),
    ("response length", "tokens", lambda ax, c: _lines(ax, c, [LENGTH], band=True)),
    ("KL", "KL", lambda ax, c: _lines(ax, c, KL_KEYS)),
    ("entropy", "nats / token", lambda ax, c: _lines(ax, c, [ENTROPY])),
    ("time per phase", "seconds", _timing),
)


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Write the PNG of `run_dir`'s metrics to `out` (default `<run dir>/plots.png`) and return its path.

    Raises FileNotFoundError when the run folder has no metrics file, and `TrackerUnavailableError` when
    matplotlib is not installed.
    """
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no metrics file at {path}: is {run_dir} a run folder of `quartet train`?")
    require_module("matplotlib", "quartet plot draws with matplotlib,", "matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    curves = read_curves(path)
    fig = Figure(figsize=(13, 11), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(3, 2)
    axes = [fig.add_subplot(grid[i // 2, i % 2]) for i in range(4)] + [fig.add_subplot(grid[2, :])]
    for ax, (title, ylabel, draw) in zip(axes, _PANELS, strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.ticklabel_format(axis="y", useOffset=False)  # entropy 6.2231..6.2235, not "+6.223" and 1e-4
        ax.grid(alpha=0.3)
        if draw(ax, curves):
            ax.legend(fontsize=8, loc="best", ncols=2 if title == "time per phase" else 1)
        else:
            _no_data(ax)
    last = max(curves.steps, default=0)
    fig.suptitle(f"{Path(run_dir).resolve().name}: {len(curves.steps)} steps (last {last})")
    target = Path(out) if out is not None else Path(run_dir) / PLOTS_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    return target
