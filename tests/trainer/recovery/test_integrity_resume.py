"""A real run's checkpoint with a flipped byte in its actor shard: the next run resumes from the previous
checkpoint, and its `resume` record names the shard, the expected and the found hash (local backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quartet.config import load_config
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.recovery.manifest import file_sha256

pytestmark = [pytest.mark.usefixtures("one_local_rank")]

COMMON = [
    "cluster.backend=local",
    "algorithm.adv_estimator=grpo",
    "data.builtin_train_size=8",
    "data.train_batch_size=2",
    "data.max_response_length=4",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.save_freq=1",
    "trainer.max_checkpoints_to_keep=0",
    "trainer.export_final=false",
]


def test_a_flipped_byte_in_a_real_run_falls_back_and_is_recorded(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    base = [*COMMON, f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
    first = RLTrainer(load_config(None, [*base, "trainer.total_steps=2"])).run()
    step2 = first.run_dir / "checkpoints" / "global_step_2"
    manifest = json.loads((step2 / "manifest.json").read_text())["files"]
    shard = max((n for n in manifest if n.startswith("actor/")), key=lambda n: manifest[n]["size"])
    data = bytearray((step2 / shard).read_bytes())
    data[len(data) // 3] ^= 0x10
    (step2 / shard).write_bytes(data)
    expected, found = manifest[shard]["sha256"], file_sha256(step2 / shard)

    second = RLTrainer(load_config(None, [*base, "trainer.total_steps=3"])).run()
    records = [json.loads(line) for line in (second.run_dir / "metrics.jsonl").read_text().splitlines()]
    (resume,) = [r for r in records if r["kind"] == "resume"]
    assert resume["step"] == 1 and resume["checkpoint"].endswith("global_step_1")
    (rejected,) = resume["rejected"]
    assert f"global_step_2: {shard}: sha256 expected {expected}, found {found}" == rejected
    assert rejected in resume["note"]
    assert [r["step"] for r in records if r["kind"] == "step"][-2:] == [2, 3]  # step 2 redone, then 3
    assert json.loads((step2 / "manifest.json").read_text())["files"][shard]["sha256"] == file_sha256(
        step2 / shard
    )
