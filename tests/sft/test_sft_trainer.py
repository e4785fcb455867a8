"""The SFT driver: sampler, a run on user files, learning on the built-in set, and the same steps on Ray."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quartet.config import QuartetConfig
from quartet.sft import EpochSampler, SFTTrainer


def _records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_sampler_visits_every_row_once_per_epoch_in_a_seeded_order() -> None:
    sampler = EpochSampler(rows=10, batch_size=4, seed=7)
    epoch0, epoch1 = sampler.batches(0), sampler.batches(1)
    assert [len(b) for b in epoch0] == [4, 4, 2] and sampler.batches_per_epoch == 3
    assert sorted(i for b in epoch0 for i in b) == list(range(10))
    assert sorted(i for b in epoch1 for i in b) == list(range(10))
    assert epoch0 != epoch1
    assert epoch0 == EpochSampler(10, 4, 7).batches(0)
    assert epoch0 != EpochSampler(10, 4, 8).batches(0)


def test_run_on_user_files_writes_metrics_and_counts_rows(
    sft_config: Callable[..., QuartetConfig], tmp_path: Path
) -> None:
    def chat(q: str, a: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}

    train = tmp_path / "train.jsonl"
    rows = [chat(f"say {w}", w) for w in ("red", "green", "blue", "red", "blue")] + [{"messages": []}]
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps(chat("say red", "red")) + "\n")
    cfg = sft_config(
        f"sft.train_files=[{train}]",
        f"sft.val_files=[{val}]",
        "sft.skip_bad_rows=true",
        "sft.batch_size=2",
        "sft.micro_batch_size_per_device=2",
        "sft.epochs=2",
        "trainer.experiment_name=files",
    )
    seen: list[str] = []
    result = SFTTrainer(cfg, on_record=lambda r: seen.append(r["kind"])).run()
    assert result.steps == 6  # ceil(5 / 2) batches x 2 epochs; the last batch of each epoch is short
    records = _records(result.run_dir)
    assert [r["kind"] for r in records] == seen
    data = {r["split"]: r for r in records if r["kind"] == "data"}
    assert (data["train"]["rows"], data["train"]["kept"], data["train"]["malformed"]) == (6, 5, 1)
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["sequences"] for r in steps] == [2, 2, 1, 2, 2, 1]
    assert all(r["tokens"] > 0 and r["lr"] > 0 and r["grad_norm"] > 0 for r in steps)
    assert [r["phase"] for r in records if r["kind"] == "eval"] == ["before", "after"]
    assert len(result.val_losses) == 2
    assert json.loads((result.run_dir / "summary.json").read_text())["steps"] == 6
    assert (result.hf_dir / "config.json").is_file()


@pytest.mark.slow
def test_sft_on_builtin_arithmetic_lowers_loss_and_raises_accuracy(
    sft_config: Callable[..., QuartetConfig],
) -> None:
    """Single-digit addition, 256 steps of 32 conversations (the defaults): about 10-15 s on an idle CPU.
    Accuracy is greedy exact match on 20 held-out problems that never occur in training."""
    result = SFTTrainer(sft_config()).run()
    assert result.steps == 256
    assert result.losses[-1] < result.losses[0] / 4
    assert result.val_losses[-1] < result.val_losses[0] / 2
    assert result.before is not None and result.after is not None
    assert result.after.total == 20
    assert result.after.accuracy >= result.before.accuracy + 0.25


@pytest.mark.ray
@pytest.mark.slow
def test_two_ray_ranks_take_the_same_steps_as_one_local_rank(
    ray_cluster: None, sft_config: Callable[..., QuartetConfig]
) -> None:
    """The global batch split over 2 ranks on the session's Ray gives the losses of 1 in-process rank."""
    common = ("sft.max_steps=3", "sft.batch_size=8", "sft.micro_batch_size_per_device=2")
    common += ("sft.eval_samples=4",)
    local = SFTTrainer(sft_config(*common, "trainer.experiment_name=local")).run()
    ray_cfg = sft_config(
        *common,
        "trainer.experiment_name=ray",
        "cluster.backend=ray",
        "cluster.namespace=quartet-tests",
        "cluster.bundles_per_node=2",
    )
    on_ray = SFTTrainer(ray_cfg).run()
    assert on_ray.steps == local.steps == 3
    assert on_ray.losses == pytest.approx(local.losses, rel=1e-4)
    assert on_ray.val_losses == pytest.approx(local.val_losses, rel=1e-4)
    assert (on_ray.run_dir / "cluster.json").is_file()
    assert (on_ray.hf_dir / "model.safetensors").is_file()
