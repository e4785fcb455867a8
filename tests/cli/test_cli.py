"""`quartet config show` and `quartet demo`, run as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.config import load_config


def test_config_show_prints_resolved_yaml_that_loads_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "show", "rollout.n=8", "actor.optim.lr=2e-6"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "shown.yaml").write_text(text)
    cfg = load_config(tmp_path / "shown.yaml")
    assert cfg == load_config(overrides=["rollout.n=8", "actor.optim.lr=2e-6"])


def test_config_show_reports_errors_with_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "actor.optim.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert "actor.optim.lrr" in err and "did you mean 'actor.optim.lr'" in err


def test_config_show_doc_lists_fields_with_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--doc"]) == 0
    out = capsys.readouterr().out
    assert "rollout.n = 4\n    Responses sampled per training prompt" in out


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "quartet.cli.main", "demo", f"trainer.output_dir={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "smoke passed" in out.stdout
    assert (tmp_path / "models").is_dir()
