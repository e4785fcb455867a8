"""`resolve_model`: the configured folder as is, else the tiny model built once under the output folder."""

from __future__ import annotations

from pathlib import Path

from quartet.config import load_config
from quartet.models.tiny import resolve_model


def test_a_configured_path_is_returned_as_is(tmp_path: Path) -> None:
    cfg = load_config(None, ["model.path=/models/somewhere", f"trainer.output_dir={tmp_path}"], check=False)
    assert resolve_model(cfg) == "/models/somewhere"
    assert not (tmp_path / "models").exists()


def test_no_path_builds_the_tiny_model_once_under_the_output_folder(tmp_path: Path) -> None:
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}"], check=False)
    first = Path(resolve_model(cfg))
    assert first.parent == tmp_path / "models" and (first / "config.json").exists()
    stamp = (first / "config.json").stat().st_mtime_ns
    assert Path(resolve_model(cfg)) == first and (first / "config.json").stat().st_mtime_ns == stamp
