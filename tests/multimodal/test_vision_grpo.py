"""GRPO on a verl-layout multimodal parquet with the tiny Qwen2-VL, through `RLTrainer` as `quartet train`
runs it (in-process roles, `cluster.backend=local`): two steps, a bad image row named and skipped, the
language model trained and the frozen vision tower untouched."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from vision_cases import image_row, png

from quartet.config import load_config
from quartet.models.loading import load_causal_lm
from quartet.tracking.run_layout import HF_DIR
from quartet.trainer import RLTrainer

# Rewards that differ within a group (so GRPO's advantages are not all 0): the response's length mod 3.
REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return len(solution_str) % 3\n"
)


def _write_data(folder: Path) -> Path:
    rows = [
        image_row(f"<image>What is 1 + {i}?", [{"bytes": png(color), "path": None}], answer=str(1 + i))
        for i, color in enumerate(["red", "blue", "green", "yellow"] * 2)
    ]
    (folder / "img").mkdir()
    (folder / "img" / "a.png").write_bytes(png("purple", (90, 50), "ellipse"))
    rows.append(
        image_row(
            "Two: <image> <image>",
            [{"bytes": None, "path": "img/a.png"}, {"bytes": png("red"), "path": None}],
        )
    )
    rows.append(image_row("<image>broken", [{"bytes": b"not an image", "path": None}]))
    rows.append(image_row("<image>missing", [{"bytes": None, "path": "img/none.png"}]))
    rows.append(image_row("<image><image> one image", [{"bytes": png("red"), "path": None}]))
    path = folder / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_grpo_trains_a_vlm_on_image_rows(tmp_path: Path) -> None:
    data = _write_data(tmp_path)
    (tmp_path / "reward.py").write_text(REWARD)
    cfg = load_config(
        None,
        [
            "model.tiny.arch=qwen2_vl",
            f"trainer.output_dir={tmp_path / 'out'}",
            f"data.train_files=[{data}]",
            f"reward.function={tmp_path / 'reward.py'}:compute_score",
            "data.skip_bad_rows=true",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "data.train_batch_size=4",
            "rollout.n=4",
            "algorithm.adv_estimator=grpo",
            "actor.use_kl_loss=true",
            "actor.mini_batch_size=4",
            "actor.micro_batch_size_per_device=8",
            "actor.mixed_precision=float32",
            "actor.optim.lr=1e-2",
            "cluster.backend=local",
            "trainer.total_steps=2",
            f"data.val_files=[{data}]",  # validation generates on image prompts too
            "data.val_batch_size=4",
            "trainer.test_freq=2",
            "trainer.val_before_train=false",
            "trainer.rollout_freq=1",
            "trainer.loggers=[jsonl]",
        ],
    )
    result = RLTrainer(cfg).run()
    assert result.steps == 2
    metrics = result.last_metrics
    assert abs(metrics["rollout/logprob_diff_mean"]) < 1e-5  # engine and trainer agree on image prompts
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "val"] == [2]
    assert (result.run_dir / "rollouts" / "step_2.jsonl").exists()
    bad = [json.loads(x) for x in (result.run_dir / "bad_rows.jsonl").read_text().splitlines()]
    named = sorted((b["row"], b["reason"]) for b in bad if b["stage"] == "load")
    assert named == sorted(
        2 * [(9, "bad_image"), (10, "bad_image"), (11, "image_count_mismatch")]
    )  # train, val
    assert "img/none.png" in next(b["message"] for b in bad if b["row"] == 10)
    before = load_causal_lm(next((tmp_path / "out").rglob("models/*/config.json")).parent).state_dict()
    after = load_causal_lm(result.run_dir / HF_DIR).state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("model.language_model.") for k in moved)
    assert not any(k.startswith("model.visual.") for k in moved)  # model.freeze_vision_tower (default)
