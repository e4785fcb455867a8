"""A caught failure with the default config (`trainer.save_freq` 10, more than the run's steps) leaves a
checkpoint of the last completed step that resumes exactly, unless the failure came after a role update of
the failing step began; the run folder's `run_state.json` says how the run ended.

Local backend (no Ray): the checkpoint and resume code is the same.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from quartet.cluster.run_record import load_run_state
from quartet.config import QuartetConfig, load_config
from quartet.tracking import Tracking
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.loop.step import StepRunner
from quartet.trainer.recovery.checkpoint import list_checkpoints
from quartet.trainer.recovery.failure_save import StepBoundary

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_local_rank")]

STEPS = 4
COMMON = [
    "cluster.backend=local",
    "algorithm.adv_estimator=grpo",
    "data.builtin_train_size=16",
    "data.train_batch_size=4",
    "data.max_response_length=8",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=2",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-3",
    f"trainer.total_steps={STEPS}",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
]


def _config(model: Path, out: Path) -> QuartetConfig:
    return load_config(None, [*COMMON, f"model.path={model}", f"trainer.output_dir={out}"])


def _scores(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["critic/score/mean"] for r in recs if r["kind"] == "step"}


def _fail_on_call(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, nth: int, with_arg: Any = None
) -> None:
    """Make `owner.name` raise on its `nth` call (counting only calls with `with_arg` among the args)."""
    original, calls = getattr(owner, name), [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if with_arg is None or with_arg in args:
            calls[0] += 1
            if calls[0] == nth:
                raise RuntimeError(f"injected failure in {name}")
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_failure_before_the_update_saves_the_last_step_and_resumes_exactly(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tiny_model_dir, tmp_path / "broken")
    assert cfg.trainer.save_freq > STEPS  # the default: no periodic save inside this run
    _fail_on_call(monkeypatch, StepRunner, "_advantages", 3)  # step 3, after its prompts were drawn
    with pytest.raises(RuntimeError, match="injected failure in _advantages"):
        RLTrainer(cfg).run()
    run_dir = cfg.trainer.run_dir
    assert [p.name for p in list_checkpoints(run_dir)] == ["global_step_2"]
    saved = json.loads((run_dir / "checkpoints/global_step_2/trainer_state.json").read_text())
    assert saved["step"] == 2 and saved["sampler"]["position"] == 8  # step 2's draw, not step 3's
    state = load_run_state(run_dir)
    assert state is not None and state.state == "failed"
    assert state.error == "RuntimeError: injected failure in _advantages" and state.ended_at is not None

    monkeypatch.undo()
    resumed = RLTrainer(cfg).run()
    assert resumed.steps == STEPS
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "resume"] == [2]
    state = load_run_state(run_dir)
    assert state is not None and state.state == "finished" and state.error == ""

    straight = RLTrainer(_config(tiny_model_dir, tmp_path / "straight")).run()
    assert _scores(run_dir) == _scores(straight.run_dir)  # the same batches after the resume
    a, b = (
        load_file(str(run_dir / "hf/model.safetensors")),
        load_file(str(straight.run_dir / "hf/model.safetensors")),
    )
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_failure_after_the_actor_update_saves_nothing(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = _config(tiny_model_dir, tmp_path)
    _fail_on_call(monkeypatch, Tracking, "phase", 3, with_arg="update_weights")  # actor of step 3 updated
    with (
        caplog.at_level(logging.WARNING, "quartet.trainer.recovery.failure_save"),
        pytest.raises(RuntimeError),
    ):
        RLTrainer(cfg).run()
    assert list_checkpoints(cfg.trainer.run_dir) == []
    assert "no checkpoint on failure: it failed in 'update_weights'" in caplog.text


def test_step_boundary_refuses_half_updated_and_already_saved_steps() -> None:
    from quartet.trainer.recovery.checkpoint import TrainerState

    b = StepBoundary(saved_step=0)
    assert b.to_save() == (None, "no step completed")
    state = TrainerState(1, {}, {}, 0.0, 1, "m")
    b.completed(state)
    b.phase("gen")
    assert b.to_save() == (state, "")  # step 2 has not touched a role yet
    b.phase("update_critic")
    b.phase("adv")  # a later phase does not clear it
    assert b.to_save()[0] is None and "in 'adv', after a role update began" in b.to_save()[1]
    b.completed(TrainerState(2, {}, {}, 0.0, 1, "m"))
    b.saved_step = 2
    assert b.to_save() == (None, "step 2 is already checkpointed")
