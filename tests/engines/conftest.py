"""Model folders for the engine tests (built once per session from the tiny causal LM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def value_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny causal LM's trunk with a fresh value head (token classification, one label)."""
    from quartet.models.tiny import save_value_model

    torch.manual_seed(1)
    return save_value_model(tiny_model_dir, tmp_path_factory.mktemp("value"))


@pytest.fixture(scope="session")
def reward_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny causal LM's trunk with a fresh scalar sequence-classification head."""
    from quartet.engines.model_init import load_reward_model

    torch.manual_seed(2)
    model = load_reward_model(tiny_model_dir)
    folder = tmp_path_factory.mktemp("reward")
    model.save_pretrained(folder)
    return folder
