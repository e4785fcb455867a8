"""`quartet demo --task reasoning_gym:<name>`: its config is demo.yaml with the task's mixture, its worked
examples are the RL set's first problems answered in reasoning-gym's format, bad names and flags are
refused before any training, and (slow) the whole pipeline runs through the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

reasoning_gym = pytest.importorskip(
    "reasoning_gym", reason="the environments extra is not installed: make install"
)

import quartet.demo  # noqa: E402
from quartet.cli.main import build_parser, main  # noqa: E402
from quartet.demo import demo_config  # noqa: E402
from quartet.demo.reasoning_gym import SETTINGS, with_worked_examples  # noqa: E402


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the demo started training")


def test_the_config_is_the_demo_with_the_tasks_mixture() -> None:
    cfg, arithmetic = demo_config([], 3, False, "reasoning_gym:gcd"), demo_config([], 3, False)
    (task,) = cfg.data.reasoning_gym.tasks
    assert (task.name, task.config, task.seed) == ("gcd", SETTINGS["gcd"], None)  # the tasks seed: data.seed
    assert cfg.data.seed == 3 and cfg.data.reasoning_gym.system_prompt == "none"
    assert cfg.trainer.experiment_name == "demo-rg-gcd"  # its own folders: the arithmetic demo's stay
    assert cfg.model == arithmetic.model and cfg.rollout == arithmetic.rollout  # the same tiny Qwen2, GRPO
    quick = demo_config(["trainer.total_steps=7"], 0, True, "reasoning_gym:chain_sum")
    assert quick.trainer.total_steps == 7 and quick.sft.epochs == 2  # --quick's sizes, then the user's


def test_worked_examples_are_the_rl_sets_first_problems_answered(tmp_path: Path) -> None:
    cfg = demo_config(
        ["sft.builtin.train_size=12", "data.builtin_train_size=40"], 1, True, "reasoning_gym:gcd"
    )
    out = with_worked_examples(cfg, tmp_path)
    (examples,) = out.sft.train_files
    sft = pq.read_table(examples).to_pylist()
    rl = pq.read_table(tmp_path / "rl" / "reasoning_gym" / "rl_train.parquet").to_pylist()
    assert len(sft) == 12 and [r["messages"][:-1] for r in sft] == [r["prompt"] for r in rl[:12]]
    dataset = reasoning_gym.create_dataset("gcd", seed=1, size=40, **SETTINGS["gcd"])
    for example, row in zip(sft, rl, strict=False):
        answer = reasoning_gym.utils.extract_answer(example["messages"][-1]["content"])
        assert dataset.score_answer(answer, dataset[row["extra_info"]["index"]]) == 1.0


def test_the_task_flag_parses_and_refuses_other_words() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo", "--task", "reasoning_gym:gcd"]).task == "reasoning_gym:gcd"
    for bad in ("reasoning_gym:", "gcd", "arithmetics"):
        with pytest.raises(SystemExit):
            parser.parse_args(["demo", "--task", bad])


def test_an_unknown_task_is_refused_with_close_names_before_training(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(quartet.demo, "run_demo", _must_not_run)
    assert main(["demo", "--task", "reasoning_gym:chain_sums"]) == 2
    err = capsys.readouterr().err
    assert "data.reasoning_gym.tasks[0].name" in err and "chain_sum" in err
    with pytest.raises(ValueError, match="--filtered-control"):
        quartet.demo.pipeline.run_demo([], task="reasoning_gym:gcd", filtered_control=True)


@pytest.mark.slow
def test_the_demo_runs_every_stage_through_the_cli(tmp_path: Path) -> None:
    """`quartet demo --task reasoning_gym:gcd --quick`, shrunk: three rows scored on the held-out set."""
    small = ["sft.epochs=1", "trainer.total_steps=2", "sft.builtin.train_size=64", "data.builtin_val_size=16"]
    argv = [sys.executable, "-m", "quartet.cli.main", "demo", "--task", "reasoning_gym:gcd", "--quick"]
    out = subprocess.run(
        [*argv, f"trainer.output_dir={tmp_path}", *small], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for row in ("SFT start", "GRPO", "more SFT (control)"):
        assert f"│ {row} " in out.stdout
    assert "held-out problems right" in out.stdout
    val = tmp_path / "demo-rg-gcd-quick-seed0" / "grpo" / "data" / "reasoning_gym" / "rl_val.parquet"
    assert len(pq.read_table(val)) == 16
