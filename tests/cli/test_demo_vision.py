"""`quartet demo --task vision`: its config and settings, its refusals (exit 2, before anything trains), and
(slow) the whole pipeline, shrunk, through the CLI: the table's three rows re-scored from the exported
models' answers, and the GRPO run folder with its pictures for `quartet inspect`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import quartet.demo
from quartet.cli.main import build_parser, main
from quartet.demo import DEMOS, demo_config
from quartet.demo.vision import QUICK_OVERRIDES, QUICK_SETTINGS, ROWS, SETTINGS, split_settings


def _must_not_run(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the demo started training")


def test_the_task_parses_and_has_an_embedded_config() -> None:
    assert build_parser().parse_args(["demo", "--task", "vision"]).task == "vision"
    assert DEMOS["vision"] == "vision.yaml"
    cfg = demo_config([], 5, False, "vision")
    assert cfg.data.builtin_task.value == "shapes" and cfg.model.tiny.arch.value == "qwen2_vl"
    assert not cfg.model.freeze_vision_tower  # a random tower has nothing to keep: the loop trains it too
    assert cfg.data.seed == cfg.sft.seed == cfg.trainer.seed == cfg.model.tiny.seed == cfg.rollout.seed == 5
    quick = demo_config([], 5, True, "vision")
    assert quick.trainer.total_steps < cfg.trainer.total_steps and quick.cluster.backend == "local"
    assert quick == demo_config(QUICK_OVERRIDES, 5, False, "vision")  # --quick is exactly those overrides


def test_settings_overrides_are_split_from_the_config() -> None:
    s, rest = split_settings(["vision.sft_steps=7", "trainer.total_steps=2", "vision.sft_lr=3e-4"], False)
    assert (s.sft_steps, s.sft_lr, s.sft_size) == (7, 3e-4, SETTINGS.sft_size) and rest == [
        "trainer.total_steps=2"
    ]
    assert split_settings([], True) == (QUICK_SETTINGS, [])
    assert demo_config(["vision.sft_steps=7"], 0, False, "vision") == demo_config([], 0, False, "vision")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--filtered-control"], "--filtered-control has no meaning for --task vision"),
        (["--device", "gpu"], "--task vision is on CPU only"),
        (["vision.sft_stepz=3"], "'vision.sft_stepz=3' is not a vision setting"),
        (["vision.sft_steps=0"], "vision.sft_steps must be > 0"),
        (["vision.sft_lr=fast"], "vision.sft_lr takes a number (float)"),
        (["vision.sft_steps"], "has no value"),
        (["data.max_prompt_length=0"], "data.max_prompt_length"),
    ],
)
def test_bad_options_exit_2_before_training(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(quartet.demo, "run_demo", _must_not_run)
    assert main(["demo", "--task", "vision", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_text_demo_refuses_vision_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quartet.demo, "run_demo", _must_not_run)
    assert main(["demo", "vision.sft_steps=3"]) == 2


def _table(stdout: str) -> dict[str, list[str]]:
    """The accuracy table's rows by model name: accuracy, correct, train time."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells and cells[0] in ROWS:
            rows[cells[0]] = cells[1:4]
    return rows


def _answers(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "answers.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_vision_demo_quick_end_to_end(tmp_path: Path) -> None:
    """~1 minute: the shrunk pipeline through the CLI. The table's rows equal a re-scoring, by the task's
    rule, of the exported models' greedy answers; the held-out pictures are in neither training set."""
    from quartet.demo.vision_sft import VisionChat, greedy_answers
    from quartet.tasks.shapes import verify_answer

    argv = [sys.executable, "-m", "quartet.cli.main", "demo", "--task", "vision", "--quick"]
    argv += [
        f"trainer.output_dir={tmp_path}",
        "vision.sft_steps=4",
        "vision.sft_size=32",
        "vision.sft_batch=8",
    ]
    argv += ["trainer.total_steps=2", "trainer.val_before_train=false", "data.builtin_train_size=64"]
    argv += ["data.builtin_val_size=16", "data.val_batch_size=16"]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"}
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = _table(out.stdout)
    assert list(table) == list(ROWS), out.stdout
    run = tmp_path / "demo-vision-quick-seed0"
    held_out = pq.read_table(run / "data" / "rl" / "rl_val.parquet").to_pylist()
    truths = [r["reward_model"]["ground_truth"] for r in held_out]
    for name, stage in zip(ROWS, ("sft_start", "grpo", "sft_control"), strict=True):
        answers = _answers(run / stage)
        assert [a["ground_truth"] for a in answers] == truths
        right = sum(verify_answer(a["answer"], t) for a, t in zip(answers, truths, strict=True))
        assert table[name][1] == f"{right}/{len(truths)}" == f"{right}/16"
        assert table[name][0] == f"{right / 16:.1%}"
        # the answers scored are the exported model's
        assert greedy_answers(VisionChat.load(run / stage / "hf"), held_out) == [a["answer"] for a in answers]
    # time-matched: the control trains until it has spent GRPO's training seconds
    assert float(table[ROWS[2]][2].removesuffix(" s")) >= float(table[ROWS[1]][2].removesuffix(" s"))
    trained = {
        c["bytes"] for f in ("sft/train.parquet", "rl/rl_train.parquet") for c in _images(run / "data" / f)
    }
    assert not trained & {c["bytes"] for c in _images(run / "data" / "rl" / "rl_val.parquet")}
    # GRPO's run, for `quartet inspect`: each recorded sample names its picture, saved in the run folder
    assert f"quartet inspect {run / 'grpo'}" in " ".join(out.stdout.split())
    records = [
        json.loads(line) for line in (run / "grpo" / "rollouts" / "step_1.jsonl").read_text().splitlines()
    ]
    named = {p for r in records for p in r["images"]}
    assert named and all((run / "grpo" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in named)


def _images(path: Path) -> list[dict[str, Any]]:
    return [cell for row in pq.read_table(path).to_pylist() for cell in row["images"]]
