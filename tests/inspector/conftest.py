"""Two real 3-step GRPO runs (local backend, every sample recorded) that the inspector tests read; run B's
engine samples in bfloat16 next to its float32 trainer, so its log-prob mismatch alarm trips every step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from quartet.config import load_config
from quartet.trainer.loop.rl_trainer import RLTrainer

RANK_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "0", "MASTER_PORT": "0"}


def _run(model_dir: Path, out: Path, name: str, rollout_seed: int, *extra: str) -> Path:
    cfg = load_config(
        None,
        [
            "cluster.backend=local",
            f"model.path={model_dir}",
            f"trainer.output_dir={out}",
            f"trainer.experiment_name={name}",
            f"rollout.seed={rollout_seed}",
            "data.builtin_train_size=64",
            "data.builtin_val_size=4",
            "data.train_batch_size=4",
            "data.max_response_length=8",
            "rollout.n=4",
            "actor.mini_batch_size=2",  # two updates a step: old log-probs and entropy get their own pass
            "actor.micro_batch_size_per_device=8",
            "actor.mixed_precision=float32",
            "trainer.total_steps=3",
            f"reward.function={Path(__file__).parent / 'varied_reward.py'}:varied",
            "trainer.test_freq=0",
            "trainer.rollout_freq=1",
            "trainer.rollout_samples=0",
            "trainer.export_final=false",
            *extra,
        ],
    )
    return RLTrainer(cfg).run().run_dir


@pytest.fixture(scope="session")
def inspect_runs(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path]]:
    """(run A, run B): the same prompts (data seed 0) sampled with two rollout seeds."""
    mp = pytest.MonkeyPatch()
    for key, value in RANK_ENV.items():
        mp.setenv(key, value)
    try:
        out = tmp_path_factory.mktemp("inspect_runs")
        a = _run(tiny_model_dir, out, "run_a", 0)
        b = _run(tiny_model_dir, out, "run_b", 1, "rollout.dtype=bfloat16")
        yield a, b
    finally:
        mp.undo()
