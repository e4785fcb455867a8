"""On-policy distillation through the trainer `quartet train` runs: a wider tiny teacher (same tokenizer)
scores the student's samples, colocated with the policy (one process) and on a Ray pool of its own; the
step's advantages are the teacher's reverse-KL signal (checked against the distillation metric through the
trained batch's advantage mean); a teacher equal to the student gives zero signal; a teacher with another
tokenizer is refused naming both folders before any worker starts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from distill_settings import DISTILL
from quartet.config import ConfigError, TinyModelConfig, load_config
from quartet.models.tiny import ensure_tiny_model
from quartet.models.tokenizer_match import TokenizerMismatch
from quartet.trainer import RLTrainer


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider, deeper tiny Qwen2 than the policy, with the same tokenizer."""
    config = TinyModelConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=3)
    return ensure_tiny_model(config, tmp_path_factory.mktemp("teacher"))


def run(overrides: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    result = RLTrainer(load_config(None, overrides), on_record=records.append).run()
    return result, [r for r in records if r["kind"] == "step"]


def check_signal(steps: list[dict[str, Any]]) -> None:
    """Two steps with the teacher's phase, and advantages that are the reverse-KL signal: with the task's
    weight at 0 and no discount, the mean advantage over model tokens is minus the mean reverse KL."""
    assert len(steps) == 2
    for m in steps:
        assert "timing_s/teacher" in m and math.isfinite(m["distill/teacher_logprob"])
        assert m["distill/reverse_kl"] != 0.0  # another model: a signal
        assert m["critic/advantages/mean"] == pytest.approx(-m["distill/reverse_kl"], rel=1e-4, abs=1e-6)


def test_two_steps_with_a_colocated_teacher(teacher_dir: Path, tmp_path: Path) -> None:
    result, steps = run(
        [
            *DISTILL,
            "cluster.backend=local",
            f"teacher.model_path={teacher_dir}",
            f"trainer.output_dir={tmp_path}",
        ]
    )
    assert result.steps == 2
    check_signal(steps)


def test_a_teacher_equal_to_the_student_gives_no_signal(tiny_model_dir: Path, tmp_path: Path) -> None:
    _, steps = run(
        [
            *DISTILL,
            "cluster.backend=local",
            f"model.path={tiny_model_dir}",
            f"teacher.model_path={tiny_model_dir}",
            "actor.mixed_precision=float32",
            "actor.optim.weight_decay=0",  # zero advantages then leave the policy as it is: step 2 too
            "actor.reuse_update_logprobs=false",  # the student's log-probs from the trainer, not the engine
            f"trainer.output_dir={tmp_path}",
        ]
    )
    for m in steps:
        assert abs(m["distill/reverse_kl"]) < 1e-5 and abs(m["critic/advantages/mean"]) < 1e-5
        assert m["critic/advantages/max"] < 1e-4 and m["critic/advantages/min"] > -1e-4


@pytest.mark.ray
def test_two_steps_with_the_teacher_on_its_own_pool(
    ray_cluster: None, teacher_dir: Path, tmp_path: Path
) -> None:
    result, steps = run(
        [
            *DISTILL,
            f"teacher.model_path={teacher_dir}",
            "cluster.separate_pools=[teacher]",
            "cluster.cpus_per_bundle=0.5",
            "cluster.namespace=quartet-tests",
            f"trainer.output_dir={tmp_path}",
        ]
    )
    assert result.steps == 2
    check_signal(steps)
    starts = [
        r for r in result.run_dir.joinpath("metrics.jsonl").read_text().splitlines() if "teacher_pool" in r
    ]
    assert starts, "the teacher's pool start is not in the run's records"


def test_a_teacher_with_another_tokenizer_is_refused(tmp_path: Path) -> None:
    other = ensure_tiny_model(TinyModelConfig(vocab_size=384), tmp_path / "other")
    with pytest.raises(TokenizerMismatch, match=r"the teacher \(.*\) and the policy \(.*\) have different"):
        run(
            [
                *DISTILL,
                "cluster.backend=local",
                f"teacher.model_path={other}",
                f"trainer.output_dir={tmp_path}",
            ]
        )
    with pytest.raises(ConfigError, match="algorithm.distill_coef: is 1, but there is no teacher"):
        load_config(None, ["algorithm.distill_coef=1"])
