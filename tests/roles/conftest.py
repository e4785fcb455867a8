"""Fixtures of the role tests: each role's own config section and the run-wide values (no QuartetConfig)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.config import ActorConfig, CriticConfig, Dtype, OptimConfig
from quartet.roles.run_values import RunValues


@pytest.fixture
def run_values(tiny_model_dir: Path) -> RunValues:
    """2 prompts x 4 responses per step, the data section's default lengths, 10 steps of lr schedule."""
    return RunValues(
        str(tiny_model_dir),
        max_prompt_length=64,
        max_response_length=32,
        prompts_per_step=2,
        responses_per_prompt=4,
        trainer_steps=10,
    )


@pytest.fixture
def actor_config() -> ActorConfig:
    """fp32, one optimizer step per update (one mini-batch of the 2 prompts), no shuffling."""
    return ActorConfig(
        optim=OptimConfig(lr=1e-3),
        mini_batch_size=2,
        micro_batch_size_per_device=2,
        shuffle=False,
        mixed_precision=Dtype.FLOAT32,
    )


@pytest.fixture
def critic_config() -> CriticConfig:
    return CriticConfig(
        optim=OptimConfig(lr=1e-3),
        mini_batch_size=2,
        micro_batch_size_per_device=2,
        mixed_precision=Dtype.FLOAT32,
    )
