"""PPO with GAE on a verl-layout multimodal parquet with the tiny Qwen2-VL, through `RLTrainer` as `quartet
train` runs it (`cluster.backend=local`): the critic is a VLM value model that reads the images, and it
trains (its checkpointed weights differ from the policy trunk it started from; its loss is finite)."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from vision_cases import image_row, png

from quartet.config import load_config
from quartet.config.errors import ConfigError
from quartet.config.model import Dtype
from quartet.engines import EngineSpec, ModelKind, TrainingEngine
from quartet.models.loading import load_causal_lm
from quartet.trainer import RLTrainer

REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return len(solution_str) % 3\n"
)


def _write_data(folder: Path) -> Path:
    rows = [
        image_row(f"<image>What is 1 + {i}?", [{"bytes": png(color), "path": None}], answer=str(1 + i))
        for i, color in enumerate(["red", "blue", "green", "yellow"])
    ]
    rows.append(image_row("No picture: say hi.", []))  # a row without images in the same batch
    rows.append(
        image_row("Two: <image> <image>", [{"bytes": png(c), "path": None} for c in ("purple", "red")])
    )
    path = folder / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _overrides(tmp_path: Path, data: Path) -> list[str]:
    return [
        "model.tiny.arch=qwen2_vl",
        f"trainer.output_dir={tmp_path / 'out'}",
        f"data.train_files=[{data}]",
        f"reward.function={tmp_path / 'reward.py'}:compute_score",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        "data.train_batch_size=2",
        "rollout.n=2",
        "algorithm.adv_estimator=gae",
        "actor.mini_batch_size=2",
        "actor.micro_batch_size_per_device=2",
        "actor.mixed_precision=float32",
        "critic.mini_batch_size=2",
        "critic.micro_batch_size_per_device=2",
        "critic.mixed_precision=float32",
        "critic.optim.lr=1e-2",
        "cluster.backend=local",
        "trainer.total_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.loggers=[jsonl]",
    ]


def test_ppo_trains_a_vlm_critic_on_image_rows(tmp_path: Path) -> None:
    data = _write_data(tmp_path)
    (tmp_path / "reward.py").write_text(REWARD)
    cfg = load_config(None, _overrides(tmp_path, data))
    result = RLTrainer(cfg).run()
    assert result.steps == 2
    metrics = result.last_metrics
    assert math.isfinite(metrics["critic/vf_loss"])
    assert abs(metrics["rollout/logprob_diff_mean"]) < 1e-5
    policy_dir = next((tmp_path / "out").rglob("models/*/config.json")).parent
    critic = TrainingEngine(EngineSpec(str(policy_dir), ModelKind.VALUE, Dtype.FLOAT32))
    start = {k: v.clone() for k, v in critic.module.state_dict().items()}
    critic.load(result.run_dir / "checkpoints" / "global_step_2" / "critic")
    after = critic.module.state_dict()
    moved = {k for k in start if not torch.equal(start[k], after[k])}
    assert "score.weight" in moved and any(k.startswith("model.language_model.") for k in moved)
    assert not any(k.startswith("model.visual.") for k in moved)  # model.freeze_vision_tower (default)
    trunk = load_causal_lm(policy_dir).state_dict()
    assert all(torch.equal(trunk[k], start[k]) for k in start if k.startswith("model."))


def test_a_vlm_critic_refuses_sequence_parallelism(tmp_path: Path) -> None:
    overrides = [*_overrides(tmp_path, tmp_path / "x.parquet"), "critic.sequence_parallel_size=2"]
    overrides += ["cluster.backend=ray", "cluster.bundles_per_node=2"]
    with pytest.raises(ConfigError, match="vision-language") as info:
        load_config(None, overrides)
    assert info.value.field == "critic.sequence_parallel_size" and "critic.sequence_parallel_size: 1" in str(
        info.value
    )
