"""`RLTrainer(cfg, reward_funcs=[...])`: a closure scores a real (short, CPU) run through the scoring
processes, and each recorded response's score is what the closure says of its text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.trainer.loop.rl_trainer import RLTrainer


@pytest.mark.usefixtures("one_local_rank")
def test_a_run_is_scored_by_callables(tiny_model_dir: Path, tmp_path: Path) -> None:
    weight = 0.5

    def length_score(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
        return [len(c) / 100.0 for c in completions]

    cfg = load_config(
        None,
        [
            "cluster.backend=local",
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.builtin_train_size=8",
            "data.builtin_val_size=2",
            "data.train_batch_size=2",
            "data.max_response_length=6",
            "rollout.n=2",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=2",
            "actor.mixed_precision=float32",
            "trainer.total_steps=1",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.rollout_freq=1",
            "trainer.rollout_samples=4",
            "trainer.export_final=false",
        ],
    )
    trainer = RLTrainer(cfg, reward_funcs=[length_score, lambda prompts, completions, **kw: [1.0]],
                        reward_weights=[1.0, weight])  # fmt: skip
    result = trainer.run()
    records = [json.loads(x) for x in (result.run_dir / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert len(records) == 4
    for rec in records:  # the record's response is the decoded text the functions saw
        assert rec["score"] == pytest.approx(len(rec["response"]) / 100.0 + weight, abs=1e-6)
    step = next(
        json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines() if '"step"' in x
    )
    assert step["reward/error_count"] == 0.0 and step["reward/extra/lambda"] == 1.0


def test_weights_without_functions_are_refused() -> None:
    with pytest.raises(ValueError, match="reward_weights without reward_funcs"):
        RLTrainer(load_config(None, []), reward_weights=[1.0])
