"""Weights & Biases: `wandb.init(project, name=experiment, dir=run dir, config)` and one `wandb.log` per
record with a step.

Offline with `WANDB_MODE=offline` (the run lands in `<run dir>/wandb/offline-run-*`; `wandb sync` uploads it
later), online when the user is logged in. A resumed run (`start_step > 0`) continues the W&B run whose id
the first attempt saved in the run folder; W&B ignores steps lower than the ones it already holds, so steps
replayed after the checkpoint keep their first values there (the JSONL file has both).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quartet.tracking.run_ids import read_run_id, write_run_id
from quartet.tracking.sink import numeric_metrics, record_step

__all__ = ["WandbSink"]


class WandbSink:
    """One W&B run; see the module docstring."""

    def __init__(
        self, run_dir: Path, project: str, experiment: str, config: Mapping[str, Any], start_step: int = 0
    ) -> None:
        import wandb

        resume_id = read_run_id(run_dir, "wandb", start_step)
        self._run = wandb.init(
            project=project,
            name=experiment,
            dir=str(run_dir),
            config=dict(config),
            id=resume_id,
            resume="allow" if resume_id else None,
        )
        write_run_id(run_dir, "wandb", self._run.id)
        self._closed = False

    def log(self, record: Mapping[str, Any]) -> None:
        step = record_step(record)
        metrics = numeric_metrics(record)
        if step is not None and metrics:
            self._run.log(metrics, step=step)

    def phase(self, name: str) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        if not self._closed:
            self._closed = True
            self._run.finish(exit_code=1 if failed else 0)
