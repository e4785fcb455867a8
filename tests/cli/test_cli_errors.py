"""Errors reach the user verbatim: a message holding rich markup (gloo's `[/__w/.../pair.cc:537]`) is printed,
not parsed (it used to raise `rich.errors.MarkupError` and hide the real error)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quartet.cli import doctor
from quartet.cli.main import main

GLOO = "[/__w/x/pair.cc:537] Read error [127.0.0.1]:1234: Connection reset by peer [/red]"


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(GLOO)


def test_train_prints_an_error_holding_markup_verbatim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import quartet.trainer

    monkeypatch.setattr(quartet.trainer.RLTrainer, "run", _fail)
    code = main(["train", f"trainer.output_dir={tmp_path}"])
    out = capsys.readouterr().out
    assert code == 1
    assert "run failed: " + GLOO in out.replace("\n", "")


def test_demo_prints_an_error_holding_markup_verbatim(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import quartet.demo

    monkeypatch.setattr(quartet.demo, "run_demo", _fail)
    code = main(["demo", "--quick"])
    out = capsys.readouterr().out
    assert code == 1
    assert "demo failed: " + GLOO in out.replace("\n", "")


def test_doctor_prints_a_cluster_error_holding_markup_verbatim(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(doctor, "not_listening", lambda address, timeout_s: GLOO)
    code = main(["doctor", "--address", "[/x]:1", "--no-smoke", "--no-probe"])
    out = capsys.readouterr().out.replace("\n", "")
    assert code == 2
    assert f"No Ray cluster at '[/x]:1': {GLOO}" in out
    assert f"no Ray cluster at '[/x]:1': {GLOO}" in out
