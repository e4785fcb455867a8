"""Failures a user meets with `quartet train`: a typo stops before any actor starts; a reward function that
raises or hangs costs those samples their reward, is counted, and never stops training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.config import load_config
from quartet.trainer import RLTrainer

REWARD = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    row = int(extra_info["index"])
    if row % 4 == 1:
        raise RuntimeError("scorer bug on purpose")
    if row % 4 == 2:
        time.sleep(3600)  # never returns within the run: only the pool's kill ends it
    return 1.0
"""


def test_typo_fails_before_any_actor_starts(capsys: pytest.CaptureFixture[str]) -> None:
    ray = sys.modules.get("ray")
    was_up = ray is not None and ray.is_initialized()
    assert main(["train", "actor.optim.lrr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert "actor.optim.lrr" in err and "actor.optim.lr" in err  # the key and the closest real one
    ray = sys.modules.get("ray")
    assert was_up or ray is None or not ray.is_initialized()  # no cluster was started for it


@pytest.mark.usefixtures("one_local_rank")
def test_raising_and_hanging_rewards_do_not_stop_training(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fn = tmp_path / "bad_reward.py"
    fn.write_text(REWARD)
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "cluster.backend=local",
            f"reward.function={fn}:compute_score",
            "reward.timeout_s=1",
            "reward.num_workers=2",
            "data.train_batch_size=4",
            "data.shuffle=false",
            "data.builtin_train_size=16",
            "data.builtin_val_size=8",
            "data.max_response_length=4",
            "rollout.n=2",
            "actor.mini_batch_size=4",
            "actor.micro_batch_size_per_device=8",
            "trainer.total_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
        ],
    )
    result = RLTrainer(cfg).run()
    assert result.steps == 2  # both steps ran
    last = result.last_metrics
    # rows 0..3 of the unshuffled second step hold one raising and one hanging prompt, n=2 samples each
    assert last["reward/error_count"] == 2 and last["reward/timeout_count"] == 2
    assert last["reward/worker_restarts"] == 2  # each stuck worker was killed and replaced
    assert last["critic/score/mean"] == pytest.approx(0.5)  # the other half scored 1
    # each failed response is named by its prompt's dataset row, in the run folder
    named = [json.loads(line) for line in (result.run_dir / "bad_rows.jsonl").read_text().splitlines()]
    assert all(n["stage"] == "reward" for n in named)
    train = [n for n in named if n["file"].endswith("rl_train.parquet")]
    assert len(train) == 8  # per step: one raising and one hanging prompt, 2 responses each
    assert {(n["step"], n["row"], n["reason"]) for n in train} == {
        (1, 1, "error"),
        (1, 2, "timeout"),
        (2, 5, "error"),
        (2, 6, "timeout"),
    }
    val = [n for n in named if n["file"].endswith("rl_val.parquet")]  # the validation after the last step
    assert val and all(n["step"] == 2 and n["row"] % 4 in (1, 2) for n in val)
    assert {n["message"] for n in named if n["reason"] == "error"} == {"RuntimeError: scorer bug on purpose"}
