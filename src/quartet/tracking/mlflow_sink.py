"""MLflow: one run (experiment = project, run name = experiment), params = the flattened config, metrics
at the record's step.

Where it logs: `MLFLOW_TRACKING_URI` when set (a server, a database), else a SQLite database in the run
folder, `sqlite:///<run dir>/mlflow.db`, with artifacts under `<run dir>/mlartifacts`. Not the
`file:<run dir>/mlruns` store: MLflow 3.x keeps that backend in maintenance mode and its `FileStore` raises
unless `MLFLOW_ALLOW_FILE_STORE=true` is set, which a library should not set for its user; SQLite is what
MLflow recommends instead. Browse with `mlflow ui --backend-store-uri sqlite:///<run dir>/mlflow.db` (the
web UI needs the full `mlflow` package; logging needs only `mlflow-skinny` + SQLAlchemy + alembic).

MLflow's limits, applied here:
- metric and param names may hold only alphanumerics and `_ - . : / space`: `@` becomes `_at_`
  (`val-core/arithmetic/reward/mean@1` -> `val-core/arithmetic/reward/mean_at_1`), any other character
  `_`, and names are cut to 250 characters;
- param values are cut to `MAX_PARAM_VAL_LENGTH` (6000 in MLflow 3.x) characters; a resumed run logs
  only the params it does not hold yet (MLflow refuses to change a logged param).
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quartet.tracking.run_ids import read_run_id, write_run_id
from quartet.tracking.sink import flatten_config, numeric_metrics, record_step

__all__ = ["MlflowSink", "default_tracking_uri", "mlflow_name"]

_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")
_MAX_KEY = 250
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000


def mlflow_name(key: str) -> str:
    """A metric or param name MLflow accepts: `@` -> `_at_`, other unsupported characters -> `_`."""
    name = _BAD_CHARS.sub("_", key.replace("@", "_at_")).lstrip("/")
    return name[:_MAX_KEY]


def default_tracking_uri(run_dir: Path) -> str:
    """`MLFLOW_TRACKING_URI` when set, else the run folder's own SQLite database."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"


def _param_text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text[:limit]


class MlflowSink:
    """One MLflow run; see the module docstring."""

    def __init__(
        self, run_dir: Path, project: str, experiment: str, config: Mapping[str, Any], start_step: int = 0
    ) -> None:
        from mlflow.tracking import MlflowClient

        self.tracking_uri = default_tracking_uri(run_dir)
        own_store = not os.environ.get("MLFLOW_TRACKING_URI")
        with warnings.catch_warnings():  # SQLAlchemy 2.1 deprecation noise from inside MLflow's store
            warnings.simplefilter("ignore", DeprecationWarning)
            self.client = MlflowClient(tracking_uri=self.tracking_uri)
            found = self.client.get_experiment_by_name(project)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            artifacts = (run_dir / "mlartifacts").resolve().as_uri() if own_store else None
            experiment_id = self.client.create_experiment(project, artifact_location=artifacts)
        resumed = self._resume(read_run_id(run_dir, "mlflow", start_step))
        self.run_id: str = resumed or self.client.create_run(experiment_id, run_name=experiment).info.run_id
        write_run_id(run_dir, "mlflow", self.run_id)
        self._log_params(config)
        self._closed = False

    def _resume(self, run_id: str | None) -> str | None:
        """The saved run, set running again; None when there is none or the store no longer has it."""
        if run_id is None:
            return None
        from mlflow.exceptions import MlflowException

        try:
            self.client.update_run(run_id, status="RUNNING")
        except MlflowException:
            return None
        return run_id

    def _log_params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        held = self.client.get_run(self.run_id).data.params
        params = {
            mlflow_name(k): _param_text(v, MAX_PARAM_VAL_LENGTH) for k, v in flatten_config(config).items()
        }
        todo = [Param(key, value) for key, value in params.items() if key not in held]
        for i in range(0, len(todo), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=todo[i : i + _PARAMS_PER_BATCH])

    def log(self, record: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step = record_step(record)
        if step is None:
            return
        now_ms = int(time.time() * 1000)
        metrics = [Metric(mlflow_name(k), v, now_ms, step) for k, v in numeric_metrics(record).items()]
        for i in range(0, len(metrics), _METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + _METRICS_PER_BATCH])

    def phase(self, name: str) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
