"""Console output: a rich progress bar over the run's steps and one compact line per record.

On a terminal the bar shows `step 12/100 · gen` (the running step and its phase), elapsed time and ETA, and
the metric lines are printed above it. When the console is not a terminal (pytest capture, CI logs, a pipe)
there is no bar: the lines are printed and nothing else, so logs hold no redraw debris.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from quartet.tracking.sink import RESERVED_KEYS, numeric_metrics, record_step

__all__ = ["ConsoleSink", "STEP_KEYS", "format_data", "format_record", "format_step", "format_val"]

STEP_KEYS = (
    ("critic/score/mean", "score", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/ppo_kl", "ppo_kl", "{:+.4f}"),
    ("actor/grad_norm", "grad_norm", "{:.3f}"),
    ("critic/vf_loss", "vf_loss", "{:.4f}"),
    ("rollout/logprob_diff_mean", "lp_diff", "{:.1e}"),
    ("timing_s/step", "step_s", "{:.2f}"),
    ("perf/throughput", "tok/s", "{:.0f}"),
)
"""(metric, label, format) of the step line, in order; metrics a step lacks are left out."""

_DATA_KEYS = (("loaded", "loaded"), ("filtered_overlong", "overlong"), ("truncated", "truncated"))
_SPEED_WINDOW_S = 3600.0
"""rich estimates the ETA from the progress of this many last seconds (its default, 30 s, is shorter than
one RL step of a real model, which leaves the ETA blank)."""


def _format(fmt: str, value: Any) -> str:
    try:
        return fmt.format(value)
    except (TypeError, ValueError):  # not a number: show it as it is rather than lose the line
        return str(value)


def format_step(rec: Mapping[str, Any]) -> str:
    """One compact line of the step's main metrics."""
    parts = [f"step {rec['step']:>4}"]
    parts += [f"{label} {_format(fmt, rec[key])}" for key, label, fmt in STEP_KEYS if key in rec]
    return "  ".join(parts)


def format_val(rec: Mapping[str, Any]) -> str:
    """The validation scores, `val-core/` prefix dropped."""
    metrics = numeric_metrics(rec)
    scores = [
        f"{k.removeprefix('val-core/')} {v:.3f}" for k, v in metrics.items() if k.startswith("val-core/")
    ]
    return f"val  step {rec['step']:>4}  " + "  ".join(scores)


def _data_report(name: str, report: Any) -> str:
    if report is None:
        return f"{name} none"
    if not isinstance(report, Mapping):
        return f"{name} {report}"
    counts = [f"{report[key]} {label}" for key, label in _DATA_KEYS if key in report]
    bad = report.get("bad_rows") or {}
    if bad:
        counts.append(f"bad rows {bad}")
    return f"{name} {report.get('rows', '?')} rows ({', '.join(counts)})"


def format_data(rec: Mapping[str, Any]) -> str:
    """The data report: rows read, loaded and dropped per split."""
    parts = [_data_report(key, value) for key, value in rec.items() if key not in RESERVED_KEYS]
    return "data  " + "  ".join(parts)


def format_memory(rec: Mapping[str, Any]) -> str:
    """The memory plan before the run, and the measured peaks after it."""

    def mib(key: str) -> str:
        return f"{float(rec[key]) / 2**20:,.0f} MiB"

    parts = [f"planned peak {mib('planned_peak_bytes')} at {rec['peak_phase']} ({rec['device']})"]
    parts.append(f"free {mib('free_bytes')}")
    if rec.get("applied"):
        parts.append("auto_fit applied " + " ".join(rec["applied"]))
    if "memory/measured_peak_rss_bytes" in rec:
        parts.append(f"measured peak RSS {mib('memory/measured_peak_rss_bytes')} (with libraries)")
    if "memory/measured_cuda_peak_bytes" in rec:
        parts.append(f"measured CUDA peak {mib('memory/measured_cuda_peak_bytes')}")
    return "memory  " + "  ".join(parts)


def format_record(rec: Mapping[str, Any]) -> str:
    """The console line of any record kind."""
    kind = rec.get("kind")
    if kind == "step":
        return format_step(rec)
    if kind == "val":
        return format_val(rec)
    if kind == "data":
        return format_data(rec)
    if kind == "cluster" and "ray" in rec:
        return f"ray  {rec['ray']}"
    if kind == "resume" and "note" in rec:
        return str(rec["note"])
    if kind in ("memory_plan", "memory") and rec.get("checked"):
        return format_memory(rec)
    if kind == "alarm" and rec.get("alarm") == "no_signal":  # the message itself is the run log's warning
        return (
            f"alarm  step {rec.get('step')}  no_signal ({rec.get('phase')})  "
            f"for {rec.get('alarm/no_signal_steps')} steps"
        )
    if kind == "alarm" and "phase" in rec:
        return (
            f"alarm  step {rec.get('step')}  {rec.get('alarm')} ({rec['phase']})  "
            f"{float(rec.get('alarm/mismatch_value', 0.0)):.3g} > "
            f"{float(rec.get('alarm/mismatch_threshold', 0.0)):.3g}"
        )
    if kind == "checkpoint" and "path" in rec:
        return f"checkpoint  step {rec.get('step')}  {rec['path']}  ({float(rec.get('seconds', 0.0)):.1f} s)"
    step = record_step(rec)
    metrics = [f"{key} {value:.4g}" for key, value in numeric_metrics(rec).items()]
    return "  ".join([str(kind), *([f"step {step:>4}"] if step is not None else []), *metrics])


class ConsoleSink:
    """Progress bar (on a terminal) plus one line per record; see the module docstring."""

    def __init__(self, total_steps: int, start_step: int = 0, console: Console | None = None) -> None:
        self.console = console if console is not None else Console(highlight=False)
        self.total = total_steps if total_steps > 0 else None
        self.done = start_step
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.console.is_terminal and not self.console.is_dumb_terminal:
            self._progress = Progress(
                TextColumn("[bold]{task.description}", table_column=Column(min_width=32, no_wrap=True)),
                BarColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=self.console,
                speed_estimate_period=_SPEED_WINDOW_S,
            )
            self._task = self._progress.add_task(self._describe(""), total=self.total, completed=start_step)
            self._progress.start()

    def _describe(self, phase: str) -> str:
        total = "?" if self.total is None else str(self.total)
        running = self.done + 1 if self.total is None or self.done < self.total else self.done
        text = f"step {running}/{total}"
        return f"{text} · {phase}" if phase else text

    def log(self, record: Mapping[str, Any]) -> None:
        step = record_step(record)
        if record.get("kind") == "step" and step is not None:
            self.done = step
            if self._progress is not None and self._task is not None:
                self._progress.update(self._task, completed=step, description=self._describe(""))
        # soft_wrap: one record, one line, however narrow the console (CI logs default to 80 columns)
        self.console.print(format_record(record), markup=False, highlight=False, soft_wrap=True)

    def phase(self, name: str) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=self._describe(name), refresh=True)

    def close(self, failed: bool = False) -> None:
        if self._progress is not None and self._task is not None:
            total = "?" if self.total is None else self.total
            state = "stopped" if failed else "done"
            self._progress.update(self._task, description=f"{state}: {self.done}/{total} steps")
            self._progress.stop()
            self._progress = None
