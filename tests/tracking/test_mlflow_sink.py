"""MLflow sink: metrics and params read back with `MlflowClient` from the run folder's SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.tracking import Tracking

pytest.importorskip("mlflow", reason="the tracking extra (mlflow-skinny) is not installed")
pytest.importorskip("sqlalchemy", reason="the tracking extra (SQLAlchemy) is not installed")

CONFIG = {"algorithm": {"adv_estimator": "grpo", "kl@coef": 0.001}, "data": {"note": "x" * 7000}}


def test_metrics_and_params_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow.tracking import MlflowClient

    from quartet.tracking.mlflow_sink import mlflow_name

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with Tracking(["mlflow"], run_dir, "quartet", "exp1", CONFIG, total_steps=2) as tracking:
        tracking.log({"kind": "val", "step": 0, "val-core/arith/reward/mean@1": 0.125})
        tracking.log({"kind": "step", "step": 1, "critic/score/mean": 0.5})
        tracking.log({"kind": "step", "step": 2, "critic/score/mean": 0.25, "info": {"nested": 1}})

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("quartet")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "exp1" and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    val_name = mlflow_name("val-core/arith/reward/mean@1")
    assert val_name == "val-core/arith/reward/mean_at_1"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, val_name)] == [(0, 0.125)]
    params = run.data.params
    assert params["algorithm.adv_estimator"] == "grpo"
    assert params["algorithm.kl_at_coef"] == "0.001"
    assert params["data.note"] == "x" * 6000  # cut to MLflow's limit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_a_failed_run_is_marked_and_resume_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    with (
        pytest.raises(RuntimeError, match="worker died"),
        Tracking(["mlflow"], tmp_path, "quartet", "exp", CONFIG, total_steps=2) as tracking,
    ):
        tracking.log({"kind": "step", "step": 1, "critic/score/mean": 0.5})
        raise RuntimeError("worker died")
    (failed,) = client.search_runs([client.get_experiment_by_name("quartet").experiment_id])
    assert failed.info.status == "FAILED"
    changed = {**CONFIG, "algorithm": {"adv_estimator": "rloo", "kl@coef": 0.001}}
    with Tracking(["mlflow"], tmp_path, "quartet", "exp", changed, total_steps=2, start_step=1) as tracking:
        tracking.log({"kind": "step", "step": 2, "critic/score/mean": 0.75})
    (run,) = client.search_runs([client.get_experiment_by_name("quartet").experiment_id])
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert run.info.run_id == failed.info.run_id and run.info.status == "FINISHED"
    assert run.data.params["algorithm.adv_estimator"] == "grpo"  # MLflow params are write-once
