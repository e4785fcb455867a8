"""`quartet train` on a tiny Qwen3-MoE: two GRPO steps on a real local Ray (subprocess), the router's metrics
in metrics.jsonl, a checkpoint, and an export that transformers loads as a Qwen3-MoE."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch


def test_two_moe_grpo_steps_on_ray_log_router_metrics_and_export(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "quartet.cli.main",
            "train",
            f"trainer.output_dir={tmp_path}",
            "trainer.experiment_name=moe",
            "cluster.address=local",  # a Ray of its own, even beside a `ray start` cluster
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.loggers=[jsonl]",
            "data.builtin_train_size=64",
            "data.train_batch_size=4",
            "rollout.n=2",
            "actor.mini_batch_size=4",
            "actor.moe_aux_loss_coef=0.01",
            "actor.moe_z_loss_coef=0.001",
            "model.tiny.arch=qwen3_moe",
            "model.tiny.hidden_size=32",
            "model.tiny.num_hidden_layers=2",
            "model.tiny.num_experts=4",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (metrics,) = tmp_path.glob("*/moe/metrics.jsonl")  # <output_dir>/<project>/<experiment>
    run = metrics.parent
    steps = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = [r for r in steps if r["kind"] == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    keys = ("aux_loss", "z_loss", "router_entropy", "load_imbalance_max", "load_imbalance_mean")
    for record in steps:
        moe = {k: record[f"moe/{k}"] for k in keys}
        assert moe["aux_loss"] > 0 and moe["z_loss"] > 0
        assert 0 < moe["router_entropy"] <= torch.log(torch.tensor(4.0)).item() + 1e-6
        assert 1.0 <= moe["load_imbalance_mean"] <= moe["load_imbalance_max"] <= 2.0  # 4 experts, top 2
    assert (run / "checkpoints" / "latest").read_text().strip() == "global_step_2"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "hf")
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert model.config.num_experts == 4 and model.model.layers[0].mlp.experts.gate_up_proj.shape[0] == 4
