"""Validation metrics (mean@n, pass@n, best@n per data source) against a direct count, with the reward
model's scores passed to the scorer as in training. The rollout, reward model and scorer are small fakes
with known outputs: what is under test is the driver's validation loop and its arithmetic."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from quartet.config import load_config
from quartet.core.batch import Batch
from quartet.trainer.loop.validation import validate

N = 3
# prompt row -> (data source, the n scores its responses get)
TABLE = {
    0: ("gsm8k", [1.0, 0.0, 0.0]),
    1: ("gsm8k", [0.0, 0.0, 0.0]),
    2: ("gsm8k", [1.0, 1.0, 1.0]),
    3: ("rm_task", [0.25, 0.5, 2.0]),
    4: ("rm_task", [-1.0, 0.0, 1.0]),
}


class Dataset:
    def __len__(self) -> int:
        return len(TABLE)

    def batch(self, indices: list[int]) -> Batch:
        return Batch(
            {"prompts": torch.zeros(len(indices), 2, dtype=torch.int64)},
            {"index": list(indices), "data_source": [TABLE[i][0] for i in indices]},
            batch_size=len(indices),
        )


class AsGroup:
    """A stand-in role group: the typed `call_batch(Role.method, ...)` runs the fake's method of that name."""

    def call_batch(self, fn: Any, *args: Any) -> Batch:
        result: Batch = getattr(self, fn.__name__)(*args)
        return result


class Rollout(AsGroup):
    def generate(self, prompts: Batch) -> Batch:
        assert prompts.meta.validation
        rows = [int(i) for i in prompts.non_tensors["index"] for _ in range(N)]
        sample = [j for _ in prompts.non_tensors["index"] for j in range(N)]
        return Batch(
            {"sample": torch.tensor(sample)},
            {"index": rows, "data_source": [TABLE[r][0] for r in rows]},
            batch_size=len(rows),
        )


class RewardModel(AsGroup):
    def __init__(self) -> None:
        self.calls = 0

    def score(self, batch: Batch) -> Batch:
        self.calls += 1
        rows, sample = batch.non_tensors["index"], batch["sample"].tolist()
        values = [TABLE[int(r)][1][j] for r, j in zip(rows, sample, strict=True)]
        return Batch({"rm_scores": torch.tensor(values), "other": torch.zeros(len(values))})


class Scorer:
    def score(self, batch: Batch) -> tuple[Batch, dict[str, float]]:
        return Batch({"scores": batch["rm_scores"].clone()}), {}  # the reward model's verdict


@pytest.mark.parametrize("val_batch_size", [2, 5])
def test_validation_metrics_per_source(val_batch_size: int) -> None:
    cfg = load_config(
        None, [f"rollout.val.n={N}", "rollout.val.temperature=1.0", f"data.val_batch_size={val_batch_size}"]
    )
    rm = RewardModel()
    workers: Any = SimpleNamespace(rollout=Rollout(), reward_model=rm)
    metrics = validate(cfg, workers, Dataset(), Scorer(), step=3)
    assert rm.calls == -(-len(TABLE) // val_batch_size)  # every validation batch went through the RM

    for source in ("gsm8k", "rm_task"):
        per_prompt = [scores for s, scores in TABLE.values() if s == source]
        flat = [x for scores in per_prompt for x in scores]
        assert metrics[f"val-core/{source}/reward/mean@{N}"] == pytest.approx(sum(flat) / len(flat))
        best = [max(scores) for scores in per_prompt]
        assert metrics[f"val-aux/{source}/reward/best@{N}"] == pytest.approx(sum(best) / len(best))
    assert metrics[f"val-core/gsm8k/reward/pass@{N}"] == pytest.approx(2 / 3)  # rows 0 and 2 pass
    assert f"val-core/rm_task/reward/pass@{N}" not in metrics  # not a 0/1 verdict: no pass@n
