"""Two GRPO steps with `rollout.quantization=fp8` on the tiny model through `quartet train` (in-process roles,
`cluster.backend=local`), read back from the run's `metrics.jsonl`: the engine samples with fp8 projections
(re-quantized at each step's weight sync), each step reports the engine-trainer log-prob mismatch that this
causes (`rollout/logprob_diff_*`, 0 exactly when both sides compute in float32 unquantized), and the
truncated importance weights (`actor.tis_cap`) correct the update for it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from quartet.cli.main import main

CAP = 2.0


def _steps(tmp_path: Path, quantization: str) -> list[dict[str, Any]]:
    out = tmp_path / quantization
    code = main(
        [
            "train",
            f"rollout.quantization={quantization}",
            f"actor.tis_cap={CAP}",
            f"trainer.output_dir={out}",
            "cluster.backend=local",
            "data.train_batch_size=2",
            "data.builtin_train_size=4",
            "data.max_response_length=6",
            "rollout.n=4",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=8",
            "actor.mixed_precision=float32",
            "trainer.total_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "trainer.loggers=[jsonl]",
        ],
    )
    assert code == 0
    (metrics_file,) = out.rglob("metrics.jsonl")
    records = [json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip()]
    steps = [r.get("metrics", r) for r in records if r.get("kind") == "step"]
    assert len(steps) == 2
    return steps


def test_two_fp8_grpo_steps_report_the_mismatch_and_apply_tis(tmp_path: Path) -> None:
    for metrics in _steps(tmp_path, "fp8"):
        diff_mean, diff_max = metrics["rollout/logprob_diff_mean"], metrics["rollout/logprob_diff_max"]
        assert math.isfinite(diff_mean) and math.isfinite(diff_max)
        assert 0 < diff_mean <= diff_max  # fp8 rounding: the float32 engine alone would give 0
        weight = metrics["actor/tis_weight_mean"]
        assert math.isfinite(weight) and 0 < weight <= CAP and weight != 1.0
        assert 0 <= metrics["actor/tis_clipfrac"] <= 1
        assert metrics["alarm/mismatch"] == 0.0  # under the low-precision threshold an fp8 engine gets
