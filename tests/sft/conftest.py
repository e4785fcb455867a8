"""Fixtures of the SFT tests: the tiny tokenizer, and a base config on the local backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quartet.config import QuartetConfig, load_config


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from quartet.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture
def sft_config(tiny_model_dir: Path, tmp_path: Path) -> Callable[..., QuartetConfig]:
    """`sft_config(*overrides)`: the tiny model, the local backend, outputs under tmp_path."""

    def make(*overrides: str) -> QuartetConfig:
        base = [
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path / 'runs'}",
            "cluster.backend=local",
        ]
        return load_config(None, [*base, *overrides])

    return make
