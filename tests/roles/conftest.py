"""Fixtures of the role tests: the config every role is built from."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.config import QuartetConfig, load_config


@pytest.fixture
def role_config(tiny_model_dir: Path) -> QuartetConfig:
    """fp32, one optimizer step per update: 2 prompts x 4 responses, one mini-batch, no shuffling."""
    return load_config(
        None,
        [
            "data.train_batch_size=2",
            "rollout.n=4",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=2",
            "actor.shuffle=false",
            "actor.mixed_precision=float32",
            "actor.optim.lr=1e-3",
            "critic.mini_batch_size=2",
            "critic.micro_batch_size_per_device=2",
            "critic.mixed_precision=float32",
            "critic.optim.lr=1e-3",
        ],
        check=False,
    )
