"""Hooks into an RL run: what a caller (the CLI, the demo, a test, a job scheduler) may observe or decide,
through one interface instead of constructor flags.

    class Progress(RunCallbacks):
        def on_record(self, record: Record) -> None:
            print(record["kind"], record.get("step"))

    RLTrainer(cfg, callbacks=[Progress(), StopAfter(100)]).run()

Every hook is a no-op by default; several callback objects are called in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["CallbackList", "OnRecord", "Record", "RunCallbacks", "StopAfter"]

Record = dict[str, Any]


class RunCallbacks:
    """Override what you need."""

    def on_record(self, record: Record) -> None:
        """Every record the run logs (data report, step metrics, validation, checkpoint, ...), after the
        trackers have it."""

    def should_stop(self, step: int, steps_this_process: int) -> bool:
        """Asked after each step (its validation and records done): True leaves the loop after a checkpoint
        of that step, as a job with a time slice would; `trainer.resume=auto` continues from it."""
        return False

    def after_roles_saved(self, folder: Path) -> None:
        """Inside each checkpoint write, after the roles wrote their state into the temporary `folder` and
        before it is renamed into place (`quartet.trainer.recovery.checkpoint.save_checkpoint`)."""


class OnRecord(RunCallbacks):
    """A plain function called with every record."""

    def __init__(self, fn: Callable[[Record], None]) -> None:
        self.fn = fn

    def on_record(self, record: Record) -> None:
        self.fn(record)


class StopAfter(RunCallbacks):
    """Leave the loop (with a checkpoint) after `steps` steps of this process."""

    def __init__(self, steps: int) -> None:
        if steps < 1:
            raise ValueError(f"StopAfter: steps must be >= 1, got {steps}")
        self.steps = steps

    def should_stop(self, step: int, steps_this_process: int) -> bool:
        return steps_this_process >= self.steps


class CallbackList(RunCallbacks):
    """Several callback objects as one: records and saves reach each in order; any may stop the run."""

    def __init__(self, callbacks: Sequence[RunCallbacks]) -> None:
        self.callbacks = list(callbacks)

    def on_record(self, record: Record) -> None:
        for cb in self.callbacks:
            cb.on_record(record)

    def should_stop(self, step: int, steps_this_process: int) -> bool:
        return any([cb.should_stop(step, steps_this_process) for cb in self.callbacks])  # ask every one

    def after_roles_saved(self, folder: Path) -> None:
        for cb in self.callbacks:
            cb.after_roles_saved(folder)
