"""`Tracking` as a whole: checks before anything starts, logger names, failure handling, a light import."""

from __future__ import annotations

import io
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from quartet.config.trainer import Logger
from quartet.tracking import TrackerUnavailableError, Tracking
from quartet.tracking.tracking import _NEEDS


@pytest.mark.parametrize(
    ("logger", "module", "package"),
    [
        ("tensorboard", "tensorboard", "tensorboard"),
        ("wandb", "wandb", "wandb"),
        ("mlflow", "mlflow", "mlflow-skinny"),
        ("mlflow", "sqlalchemy", "SQLAlchemy"),
    ],
)
def test_missing_package_fails_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logger: str, module: str, package: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    with pytest.raises(TrackerUnavailableError) as err:
        Tracking(["console", logger], tmp_path, "quartet", "t", {}, total_steps=1)
    message = str(err.value)
    assert f"trainer.loggers has '{logger}' but the {package} package is not installed" in message
    assert "pip install 'quartet[tracking]'" in message
    assert list(tmp_path.iterdir()) == []


def test_every_logger_of_the_config_is_known_and_unknown_names_fail(tmp_path: Path) -> None:
    assert set(_NEEDS) == set(Logger) - {Logger.CONSOLE, Logger.JSONL}
    with pytest.raises(ValueError, match="unknown logger 'tensorbord'; choose from console, jsonl"):
        Tracking(["tensorbord"], tmp_path, "quartet", "t", {}, total_steps=1)
    with Tracking([Logger.JSONL, "JSONL"], tmp_path, "quartet", "t", {}, total_steps=1) as tracking:
        tracking.log({"kind": "step", "step": 1})
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1  # duplicates dropped


def test_a_failing_sink_warns_and_the_jsonl_keeps_the_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = io.StringIO()
    with Tracking(["console"], tmp_path, "quartet", "t", {}, total_steps=2, console=Console(file=out)) as t:
        out.close()  # the console can no longer print
        with caplog.at_level(logging.WARNING, logger="quartet.tracking"):
            t.log({"kind": "step", "step": 1, "critic/score/mean": 0.5})
    assert "console sink failed on a step record" in caplog.text
    assert '"critic/score/mean": 0.5' in (tmp_path / "metrics.jsonl").read_text()


def test_importing_the_package_imports_no_tracker() -> None:
    code = (
        "import sys, quartet.tracking, quartet.cli.main\n"
        "heavy = {'torch', 'matplotlib', 'mlflow', 'wandb', 'tensorboard'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
