"""The no-signal alarm (`trainer.no_signal_steps`): N steps without a learning signal trip it once.

Hand-built batches whose advantages come from `quartet.core`'s GRPO (or are set by hand for the other
estimators) feed the watch; then one short real run on the local backend with a reward function that returns
a constant, so what the tiny model samples does not matter.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from quartet.config import ConfigError, load_config
from quartet.core.advantages import compute_grpo
from quartet.core.batch import Batch
from quartet.trainer.loop.no_signal_alarm import NO_SIGNAL_METRIC, NoSignalAlarm, NoSignalWatch, step_signal
from quartet.trainer.loop.rl_trainer import RLTrainer

WIDTH = 3
"""Response tokens per row."""
GROUP = 2
"""Responses per prompt (rollout.n) of the hand-built batches."""


def _batch(scores: list[float], advantages: torch.Tensor | None = None, group: int = GROUP) -> Batch:
    """Rows of `group` consecutive responses per prompt, each scored on its last token; the advantages are
    GRPO's of these scores unless given."""
    mask = torch.ones(len(scores), WIDTH)
    token_scores = torch.zeros(len(scores), WIDTH)
    token_scores[:, -1] = torch.tensor(scores)
    uids = np.array([f"p{i // group}" for i in range(len(scores))], dtype=object)
    if advantages is None:
        advantages = compute_grpo(token_scores, mask, uids).advantages
    columns = {"token_level_scores": token_scores, "response_mask": mask, "advantages": advantages}
    return Batch(columns, {"uid": uids})


def _watch(tmp_path: Path, *overrides: str, check: bool = True) -> NoSignalWatch:
    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", *overrides], check=check)
    return NoSignalWatch.from_config(cfg)


def _feed(
    watch: NoSignalWatch, batches: list[Batch], grad_norms: list[float | None] | None = None
) -> tuple[list[int], list[NoSignalAlarm]]:
    """Steps 1.. of `batches`: (`alarm/no_signal` of each step, the alarms returned)."""
    standing: list[int] = []
    alarms: list[NoSignalAlarm] = []
    for step, batch in enumerate(batches, start=1):
        norm = grad_norms[step - 1] if grad_norms is not None else 0.5
        metrics = {} if norm is None else {"actor/grad_norm": norm}
        alarm = watch.observe(step, batch, metrics)
        alarms += [alarm] if alarm is not None else []
        standing.append(int(watch.standing))
    return standing, alarms


EQUAL = [0.0] * 8
"""4 groups of 2, every reward 0: a model that never gets a reward."""
ONE_DIFFERS = [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
"""The third group's two responses differ: the batch has a signal."""


def test_equal_groups_trip_after_exactly_n_steps_and_once(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "trainer.no_signal_steps=3", "rollout.n=2")
    standing, alarms = _feed(watch, [_batch(EQUAL)] * 6)
    assert standing == [0, 0, 1, 1, 1, 1]
    (alarm,) = alarms
    assert alarm.step == 3 and alarm.steps == 3 and alarm.phases == ("rewards",)
    message = alarm.message()
    head = "no-signal alarm at step 3: for 3 steps all 4 groups had equal rewards (mean reward 0.000)"
    assert message.startswith(head)
    assert "every advantage is 0, nothing is learned" in message
    assert "trainer.sft_warm_start=true" in message and "model.path=DIR" in message
    assert "trainer.no_signal_steps=0 turns this check off" in message
    assert alarm.causes[0].startswith("a model that never gets a reward")  # every reward 0: the likeliest
    record = alarm.record()
    assert record["alarm"] == "no_signal" and record["step"] == 3 and record["phase"] == "rewards"
    assert record["alarm/no_signal_steps"] == 3 and record["message"] == message


def test_one_group_that_differs_is_a_signal(tmp_path: Path) -> None:
    batch = _batch(ONE_DIFFERS)  # three uniform groups of four are normal; the fourth teaches
    signal = step_signal(batch, needs_group=True)
    assert (signal.groups, signal.equal_groups, signal.silent) == (4, 3, False)
    assert signal.max_abs_advantage > 0.5  # GRPO's (1 - 0.5) / std of the differing group
    standing, alarms = _feed(_watch(tmp_path, "trainer.no_signal_steps=2"), [batch] * 10)
    assert alarms == [] and standing == [0] * 10


def test_a_signal_in_between_breaks_the_streak_and_rearms_it(tmp_path: Path) -> None:
    silent = _batch(EQUAL)
    healthy = _batch(ONE_DIFFERS)
    batches = [silent, healthy, silent, silent, healthy] + [silent] * 5 + [healthy] + [silent] * 3
    standing, alarms = _feed(_watch(tmp_path, "trainer.no_signal_steps=3"), batches)
    assert standing == [0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1]
    assert [a.step for a in alarms] == [8, 14]  # the second only after the signal came back at step 11


def test_zero_gradients_trip_even_with_a_reward_signal(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "trainer.no_signal_steps=3")
    batches = [_batch(ONE_DIFFERS)] * 6
    # a step without an actor update (None) neither counts nor breaks the streak; a nonzero norm breaks it
    norms: list[float | None] = [0.0, 0.3, 0.0, None, 0.0, 0.0]
    standing, alarms = _feed(watch, batches, norms)
    assert standing == [0, 0, 0, 0, 0, 1]
    (alarm,) = alarms
    assert alarm.step == 6 and alarm.phases == ("gradients",)
    assert "for 3 steps the actor's gradient norm (actor/grad_norm) was 0" in alarm.message()
    assert "no trainable parameter reaches the loss" in alarm.message()


def test_both_streaks_in_one_alarm(tmp_path: Path) -> None:
    standing, alarms = _feed(_watch(tmp_path, "trainer.no_signal_steps=2"), [_batch(EQUAL)] * 3, [0.0] * 3)
    assert standing == [0, 1, 1]
    (alarm,) = alarms
    assert alarm.phases == ("rewards", "gradients") and alarm.record()["phase"] == "rewards,gradients"
    assert "nothing is learned; actor/grad_norm was 0 too" in alarm.message()
    assert "no trainable parameter" not in alarm.message()  # the zero advantages explain the zero gradient


def test_zero_turns_it_off(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "trainer.no_signal_steps=0")
    standing, alarms = _feed(watch, [_batch(EQUAL)] * 8, [0.0] * 8)
    assert not watch.enabled and alarms == [] and standing == [0] * 8
    assert _watch(tmp_path).steps == 5  # the default
    with pytest.raises(ConfigError, match="no_signal_steps") as caught:
        _watch(tmp_path, "trainer.no_signal_steps=-1")
    assert "must be >= 0" in str(caught.value)


def test_one_response_per_group_names_rollout_n(tmp_path: Path) -> None:
    batch = _batch([0.0, 1.0, 1.0, 0.0], group=1)  # different rewards, but no group has two to compare
    assert float(batch["advantages"].abs().max()) == 0.0  # GRPO gives a group of one 0
    # `validate` refuses rollout.n=1 with grpo; a config built without it (or a group of one left by a
    # filter) still meets the watch
    watch = _watch(tmp_path, "trainer.no_signal_steps=2", "rollout.n=1", check=False)
    _, alarms = _feed(watch, [batch] * 2)
    (alarm,) = alarms
    assert alarm.causes[0].startswith("rollout.n=1 with the group estimator grpo")
    assert "all 4 groups had equal rewards (mean reward 0.500)" in alarm.message()


def test_non_group_estimators_trip_on_a_constant_batch_only(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "trainer.no_signal_steps=2", "algorithm.adv_estimator=gae")
    values = torch.full((8, WIDTH), 0.25)  # a critic's advantages are not 0 even on a constant reward
    varied = _batch([0.0, 1.0] * 4, advantages=values)
    assert _feed(watch, [varied] * 4) == ([0, 0, 0, 0], [])  # groups of equal rewards mean nothing to GAE
    constant = _batch([1.0] * 8, advantages=values)
    _, alarms = _feed(watch, [constant] * 2)
    (alarm,) = alarms
    message = alarm.message()
    assert "all 8 responses had the same reward (mean reward 1.000)" in message
    assert "only the KL penalty moves the policy" in message  # advantages not 0: no "nothing is learned"
    assert alarm.causes[0].startswith("a reward function that returns a constant (every response")


def test_zero_advantages_count_for_any_estimator(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "trainer.no_signal_steps=2", "algorithm.adv_estimator=reinforce_plus_plus")
    tiny = torch.full((8, WIDTH), 1e-9)
    _, alarms = _feed(watch, [_batch([0.0, 1.0] * 4, advantages=tiny)] * 2)
    (alarm,) = alarms
    assert "every advantage was 0" in alarm.message()


def test_turn_rewards_are_a_signal_under_equal_outcomes(tmp_path: Path) -> None:
    batch = _batch(EQUAL, advantages=torch.full((8, WIDTH), 0.3))  # the turns' credit
    batch = batch.union(Batch({"turn_rewards": torch.rand(8, WIDTH)}))
    turns = ("algorithm.turn_reward_coef=0.5", "rollout.multi_turn.enable=true")
    watch = _watch(tmp_path, "trainer.no_signal_steps=2", *turns)
    assert _feed(watch, [batch] * 4) == ([0, 0, 0, 0], [])


# ---- through the trainer --------------------------------------------------------------------------------


def _always_zero(prompts: list[Any], completions: list[str], **kwargs: Any) -> list[float]:
    return [0.0 for _ in completions]


@pytest.mark.usefixtures("one_local_rank")
def test_a_run_with_a_constant_reward_warns_once(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(
        None,
        [
            "cluster.backend=local",
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.builtin_train_size=8",
            "data.train_batch_size=2",
            "data.max_response_length=4",
            "rollout.n=2",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=4",
            "actor.mixed_precision=float32",
            "trainer.total_steps=3",
            "trainer.no_signal_steps=2",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.export_final=false",
        ],
    )
    with caplog.at_level(logging.WARNING):
        result = RLTrainer(cfg, reward_funcs=[_always_zero]).run()
    warnings = [r.getMessage() for r in caplog.records if "no-signal alarm" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("no-signal alarm at step 2: for 2 steps all 2 groups had equal rewards")
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    assert [r[NO_SIGNAL_METRIC] for r in steps] == [0.0, 1.0, 1.0]
    assert all(r["actor/grad_norm"] == 0.0 for r in steps)  # GRPO, no KL or entropy term: exactly 0
    (alarm,) = [r for r in records if r["kind"] == "alarm"]
    assert alarm["alarm"] == "no_signal" and alarm["step"] == 2 and alarm["message"] == warnings[0]
    assert alarm["phase"] == "rewards,gradients"
