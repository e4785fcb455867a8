"""GKD through `quartet train`: two steps with a colocated wider teacher whose top-k log-probs reach the
actor's loss (`distill/gkd_jsd` > 0, and the teacher's argmax agreement is a share); a teacher equal to the
student gives zero divergence (its top-k and the student's log-probs at those ids line up position by
position); configurations GKD cannot serve are refused naming the keys."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from distill_settings import DISTILL
from quartet.config import ConfigError, TinyModelConfig, load_config
from quartet.models.tiny import ensure_tiny_model
from quartet.trainer import RLTrainer

GKD = [*DISTILL, "algorithm.gkd_coef=1.0", "algorithm.gkd_top_k=4", "cluster.backend=local"]


@pytest.fixture(scope="module")
def wide_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyModelConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=3)
    return ensure_tiny_model(config, tmp_path_factory.mktemp("gkd_teacher"))


def steps_of(overrides: list[str]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    RLTrainer(load_config(None, overrides), on_record=records.append).run()
    return [r for r in records if r["kind"] == "step"]


@pytest.mark.parametrize("fused", ["true", "false"], ids=["fused_head", "plain_head"])
def test_two_gkd_steps_with_a_colocated_teacher(wide_teacher: Path, tmp_path: Path, fused: str) -> None:
    steps = steps_of(
        [
            *GKD,
            f"teacher.model_path={wide_teacher}",
            f"model.fused_head={fused}",
            f"trainer.output_dir={tmp_path}",
        ]
    )
    assert len(steps) == 2
    for m in steps:
        assert m["distill/gkd_jsd"] > 1e-4 and math.isfinite(m["actor/pg_loss"])
        assert 0.0 <= m["distill/teacher_argmax_agree"] <= 1.0


def test_a_teacher_equal_to_the_student_gives_zero_divergence(tiny_model_dir: Path, tmp_path: Path) -> None:
    steps = steps_of(
        [
            *GKD,
            "algorithm.distill_coef=0",  # GKD alone
            "algorithm.gkd_beta=0.3",
            f"model.path={tiny_model_dir}",
            f"teacher.model_path={tiny_model_dir}",
            "actor.mixed_precision=float32",
            "actor.optim.weight_decay=0",
            f"trainer.output_dir={tmp_path}",
        ]
    )
    # Step 1: before any update the student is the teacher. The teacher's argmax agreeing with a sample
    # drawn at temperature 1 is a share strictly between 0 and 1 on a random tiny model.
    assert abs(steps[0]["distill/gkd_jsd"]) < 1e-6
    assert 0.0 <= steps[0]["distill/teacher_argmax_agree"] <= 1.0


def test_configurations_gkd_cannot_serve_are_refused(wide_teacher: Path) -> None:
    with pytest.raises(ConfigError, match="algorithm.gkd_coef: is 1, but there is no teacher"):
        load_config(None, ["algorithm.gkd_coef=1"])
    with pytest.raises(ConfigError, match=r"model.remove_padding=True: top-k and support log-probs"):
        load_config(
            None, ["algorithm.gkd_coef=1", f"teacher.model_path={wide_teacher}", "model.remove_padding=true"]
        )
    with pytest.raises(ConfigError, match=r"algorithm.gkd_beta: must lie in \[0, 1\]"):
        load_config(None, ["algorithm.gkd_beta=2"])
