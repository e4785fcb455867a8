"""The run as a session: whatever fails after the trackers start, everything started is closed, in reverse
order, and the run folder says the run failed; callbacks see records and decide when to stop."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.trainer.loop import session
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.records.callbacks import CallbackList, OnRecord, RunCallbacks, StopAfter


def _cfg(model: Path, out: Path) -> Any:
    return load_config(
        None,
        [
            f"model.path={model}",
            f"trainer.output_dir={out}",
            "cluster.backend=local",
            "data.train_batch_size=4",
            "data.builtin_train_size=8",
            "data.builtin_val_size=4",
            "data.max_response_length=4",
            "rollout.n=2",
            "actor.mini_batch_size=4",
            "actor.micro_batch_size_per_device=8",
            "trainer.total_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
        ],
    )


@pytest.mark.usefixtures("one_local_rank")
def test_a_failure_while_starting_workers_closes_what_was_started(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    closed: list[str] = []
    from quartet.rewards.compute import RewardComputer

    real_close = RewardComputer.close

    def close(self: RewardComputer) -> None:
        closed.append("reward")
        real_close(self)

    def no_workers(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no workers today")

    monkeypatch.setattr(RewardComputer, "close", close)
    monkeypatch.setattr(session, "start_workers", no_workers)
    seen: list[str] = []
    trainer = RLTrainer(_cfg(tiny_model_dir, tmp_path), on_record=lambda r: seen.append(r["kind"]))
    with pytest.raises(RuntimeError, match="no workers today"):
        trainer.run()
    assert closed == ["reward"]  # the scorer pool started before the workers is closed
    state = json.loads((trainer.run_dir / "run_state.json").read_text())
    assert state["state"] == "failed" and state["error"] == "RuntimeError: no workers today"
    assert seen[:2] == ["data", "memory_plan"]  # records reached the callbacks before the failure
    assert trainer.tracking is not None and trainer.tracking._closed  # the trackers were finished


@pytest.mark.usefixtures("one_local_rank")
def test_callbacks_see_every_record_and_stop_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    class Count(RunCallbacks):
        def __init__(self) -> None:
            self.kinds: list[str] = []
            self.saved: list[str] = []

        def on_record(self, record: dict[str, Any]) -> None:
            self.kinds.append(record["kind"])

        def after_roles_saved(self, folder: Path) -> None:
            self.saved.append(folder.name)

    count = Count()
    result = RLTrainer(_cfg(tiny_model_dir, tmp_path), callbacks=[count, StopAfter(1)]).run()
    assert result.steps == 1  # total_steps=2, stopped after 1
    assert count.kinds.count("step") == 1 and count.kinds.count("checkpoint") == 1
    assert count.saved == [".tmp-global_step_1"]  # inside the write, before the rename
    state = json.loads((result.run_dir / "run_state.json").read_text())
    assert state["state"] == "finished"


def test_callback_list_asks_every_callback_and_refuses_a_zero_stop() -> None:
    asked: list[int] = []

    class Ask(RunCallbacks):
        def __init__(self, answer: bool) -> None:
            self.answer = answer

        def should_stop(self, step: int, steps_this_process: int) -> bool:
            asked.append(step)
            return self.answer

    records: list[dict[str, Any]] = []
    both = CallbackList([Ask(True), Ask(False), OnRecord(records.append)])
    assert both.should_stop(3, 1) is True and asked == [3, 3]
    both.on_record({"kind": "step"})
    assert records == [{"kind": "step"}]
    assert StopAfter(2).should_stop(5, 1) is False and StopAfter(2).should_stop(5, 2) is True
    with pytest.raises(ValueError, match="steps must be >= 1"):
        StopAfter(0)
