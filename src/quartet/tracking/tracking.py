"""`Tracking`: the run's metric sinks behind one object.

    with Tracking(cfg.trainer.loggers, run_dir, project="quartet", experiment="demo",
                  config=resolved, total_steps=100) as tracking:
        tracking.phase("gen")
        tracking.log({"kind": "step", "step": 1, "critic/score/mean": 0.5})

`<run dir>/metrics.jsonl` is always written, listed in `loggers` or not, and always first: it is the record
of truth, and an error writing it stops the run. The other sinks come in the order configured. Every
optional package is imported before any sink starts, so a missing one fails the run before training with
`TrackerUnavailableError` naming the extra. An error in another sink while logging (a W&B or MLflow server
that is down) is logged as a warning and the run goes on: the JSONL file still has the record.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from rich.console import Console

from quartet.config.trainer import Logger
from quartet.tracking.console_sink import ConsoleSink
from quartet.tracking.errors import require_module
from quartet.tracking.jsonl_sink import JsonlSink
from quartet.tracking.run_layout import METRICS_FILE
from quartet.tracking.sink import Sink

__all__ = ["Tracking"]

log = logging.getLogger(__name__)

_NEEDS: dict[Logger, tuple[tuple[str, str], ...]] = {
    Logger.TENSORBOARD: (("tensorboard", "tensorboard"),),
    Logger.WANDB: (("wandb", "wandb"),),
    # the default SQLite store needs SQLAlchemy and alembic, which mlflow-skinny does not bring
    Logger.MLFLOW: (("mlflow", "mlflow-skinny"), ("sqlalchemy", "SQLAlchemy"), ("alembic", "alembic")),
}
"""(module, package) pairs each optional sink imports."""


def _loggers(loggers: Iterable[Logger | str]) -> list[Logger]:
    """Configured loggers as `Logger`s, duplicates dropped, order kept; an unknown name is a ValueError."""
    out: list[Logger] = []
    for name in loggers:
        try:
            logger = Logger(str(name).lower())
        except ValueError:
            known = ", ".join(member.value for member in Logger)
            raise ValueError(f"trainer.loggers: unknown logger {name!r}; choose from {known}") from None
        if logger not in out:
            out.append(logger)
    return out


class Tracking:
    """Fans records out to the JSONL file and the configured sinks; see the module docstring."""

    def __init__(
        self,
        loggers: Iterable[Logger | str],
        run_dir: Path,
        project: str,
        experiment: str,
        config: Mapping[str, Any],
        total_steps: int,
        start_step: int = 0,
        console: Console | None = None,
    ) -> None:
        wanted = _loggers(loggers)
        for logger in wanted:
            for module, package in _NEEDS.get(logger, ()):
                require_module(module, f"trainer.loggers has '{logger.value}'", package)
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl = JsonlSink(self.run_dir / METRICS_FILE)
        self._sinks: list[tuple[Logger, Sink]] = []
        self._closed = False
        try:
            for logger in wanted:
                sink = self._build(logger, project, experiment, config, total_steps, start_step, console)
                if sink is not None:
                    self._sinks.append((logger, sink))
        except BaseException:
            self._close(failed=True)
            raise

    def _build(
        self,
        logger: Logger,
        project: str,
        experiment: str,
        config: Mapping[str, Any],
        total_steps: int,
        start_step: int,
        console: Console | None,
    ) -> Sink | None:
        run_dir = self.run_dir
        if logger is Logger.CONSOLE:
            return ConsoleSink(total_steps, start_step, console)
        if logger is Logger.TENSORBOARD:
            from quartet.tracking.tensorboard_sink import TensorBoardSink

            return TensorBoardSink(run_dir / "tensorboard", config)
        if logger is Logger.WANDB:
            from quartet.tracking.wandb_sink import WandbSink

            return WandbSink(run_dir, project, experiment, config, start_step)
        if logger is Logger.MLFLOW:
            from quartet.tracking.mlflow_sink import MlflowSink

            return MlflowSink(run_dir, project, experiment, config, start_step)
        return None  # JSONL: always on, built above

    def log(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Write one record to every sink; returns it as stored (with `time`)."""
        stored = self.jsonl.stamp(record)
        self.jsonl.log(stored)
        for logger, sink in self._sinks:
            try:
                sink.log(stored)
            except Exception as err:  # a remote tracker's hiccup must not end a training run
                log.warning("%s sink failed on a %s record: %s", logger.value, stored.get("kind"), err)
        return stored

    def phase(self, name: str) -> None:
        """The running step entered phase `name`; shown by the console progress bar."""
        for _, sink in self._sinks:
            sink.phase(name)

    def close(self) -> None:
        """Flush and finish every sink; calling it again does nothing."""
        self._close(failed=False)

    def _close(self, failed: bool) -> None:
        if self._closed:
            return
        self._closed = True
        errors: list[BaseException] = []
        for logger, sink in reversed(self._sinks):
            try:
                sink.close(failed)
            except Exception as err:  # close the others, then report
                log.warning("%s sink failed to close: %s", logger.value, err)
                errors.append(err)
        self.jsonl.close(failed)
        if errors and not failed:  # when failing, the run's own exception is the one to see
            raise errors[0]

    def __enter__(self) -> Tracking:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._close(failed=exc_type is not None)
