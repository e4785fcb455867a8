"""What a newcomer's first commands print: `quartet train` with nothing, its `--help`, a config path that is
a folder or missing, the closing line of a resumed run, and an install without a deprecation warning."""

from __future__ import annotations

import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.cli.train_cmd import FIRST_CONFIGS, finished_text
from quartet.config import load_config
from quartet.trainer import RLResult

ROOT = Path(__file__).resolve().parents[2]


def test_train_without_arguments_prints_usage_and_examples_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["train"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: quartet train")
    assert "nothing was started" in err and "quartet config show --doc" in err
    for path, _ in FIRST_CONFIGS:
        assert f"quartet train {path}" in err
        load_config(ROOT / path)  # every named config exists and validates
    assert list(tmp_path.iterdir()) == []  # no runs/ folder, no Ray session files


def test_train_help_points_to_the_keys_and_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["train", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "quartet config show --doc" in out and "examples/README.md" in out
    assert "quartet train examples/grpo_arithmetic/config.yaml" in out


def test_a_folder_given_as_config_is_named_a_folder_with_the_files_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "run.yaml").write_text("trainer: {total_steps: 1}\n")
    assert main(["train", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"config error: config file {tmp_path} is a folder, not a file" in err
    assert f"fix: pass one of: {tmp_path / 'run.yaml'}" in err


def test_a_missing_config_error_has_no_empty_field_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["train", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: config file {missing} does not exist\n")
    assert ": :" not in err


def test_the_closing_line_says_what_this_call_trained(tmp_path: Path) -> None:
    fresh = RLResult(tmp_path, steps=10, seconds=3.0, total_steps=10)
    assert finished_text(fresh) == f"done: 10 steps in 3.0 s; run folder {tmp_path}"
    resumed = RLResult(tmp_path, steps=10, seconds=3.0, total_steps=10, resumed_at=4)
    assert resumed.steps_this_run == 6
    assert finished_text(resumed).startswith("done: steps 5-10 of 10 trained now (resumed after step 4)")
    finished = RLResult(tmp_path, steps=10, seconds=3.0, total_steps=10, resumed_at=10)
    text = finished_text(finished)
    assert text.startswith(f"nothing trained this time: {tmp_path} already holds 10 of 10 steps")
    assert "done" not in text and "nothing left to train" not in text  # the resume record's words, once


def test_the_package_metadata_uses_an_spdx_license_string() -> None:
    """A `license = {text = ...}` table makes setuptools >= 77 print a deprecation warning at every install;
    an SPDX string needs setuptools >= 77 to build."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]


def test_a_reader_that_leaves_early_is_no_error() -> None:
    """`quartet config show --doc | head`: no BrokenPipeError traceback, exit status 0."""
    line = f"set -o pipefail; {shlex.quote(sys.executable)} -m quartet.cli.main config show --doc | head -1"
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("data.train_files = ")
