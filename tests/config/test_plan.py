"""`plan_step`: every decision of the step plan against a truth table written by hand from the rules."""

from __future__ import annotations

import dataclasses

import pytest

from quartet.config import OldLogprobs, QuartetConfig, RefLogprobs, StepPlan, load_config, plan_step

ONE_STEP = ["data.train_batch_size=4", "actor.mini_batch_size=4"]  # one optimizer step over the batch


def _plan(*overrides: str) -> StepPlan:
    return plan_step(load_config(None, list(overrides), check=False))


@pytest.mark.parametrize(
    ("overrides", "source"),
    [
        (ONE_STEP, OldLogprobs.UPDATE),
        (["data.train_batch_size=4", "actor.mini_batch_size=2"], OldLogprobs.ACTOR_PASS),  # two steps
        ([*ONE_STEP, "actor.epochs=2"], OldLogprobs.ACTOR_PASS),
        ([*ONE_STEP, "actor.reuse_update_logprobs=false"], OldLogprobs.ACTOR_PASS),
        ([*ONE_STEP, "algorithm.use_kl_in_reward=true"], OldLogprobs.ACTOR_PASS),  # the penalty reads them
        ([*ONE_STEP, "algorithm.filter_groups=true"], OldLogprobs.ACTOR_PASS),
        ([*ONE_STEP, "actor.use_kl_loss=true"], OldLogprobs.UPDATE),  # the loss's KL needs no old ones
    ],
)
def test_old_logprobs_come_from_the_update_only_for_one_plain_step(
    overrides: list[str], source: OldLogprobs
) -> None:
    assert _plan(*overrides).old_logprobs is source


@pytest.mark.parametrize(
    ("overrides", "source", "roles"),
    [
        ([], RefLogprobs.NONE, ("actor", "rollout")),
        (["actor.use_kl_loss=true"], RefLogprobs.REFERENCE, ("actor", "rollout", "reference")),
        (["algorithm.use_kl_in_reward=true"], RefLogprobs.REFERENCE, ("actor", "rollout", "reference")),
        (["actor.use_kl_loss=true", "model.lora.rank=8"], RefLogprobs.ACTOR, ("actor", "rollout")),
        (["model.lora.rank=8"], RefLogprobs.NONE, ("actor", "rollout")),
    ],
)
def test_reference_log_probs_only_for_a_kl_term_and_from_the_actor_with_lora(
    overrides: list[str], source: RefLogprobs, roles: tuple[str, ...]
) -> None:
    plan = _plan(*overrides)
    assert plan.ref_logprobs is source
    assert plan.roles == roles


@pytest.mark.parametrize(
    ("estimator", "critic", "greedy"),
    [("gae", True, False), ("grpo", False, False), ("remax", False, True), ("rloo", False, False)],
)
def test_critic_for_gae_only_and_a_greedy_baseline_for_remax(
    estimator: str, critic: bool, greedy: bool
) -> None:
    plan = _plan(f"algorithm.adv_estimator={estimator}")
    assert (plan.critic, plan.greedy_baseline) == (critic, greedy)
    assert ("critic" in plan.roles) is critic


def test_switches_copied_from_their_sections() -> None:
    plan = _plan(
        "reward.model_path=/models/rm",
        "algorithm.use_kl_in_reward=true",
        "actor.use_kl_loss=true",
        "algorithm.filter_groups=true",
        "rollout.sleep_while_training=false",
        "trainer.critic_warmup=3",
        "algorithm.adv_estimator=gae",
    )
    assert (plan.reward_model, plan.kl_in_reward, plan.kl_loss, plan.dynamic_sampling) == (True,) * 4
    assert not plan.sleep_rollout
    assert plan.roles == ("actor", "rollout", "reference", "critic", "reward_model")
    assert [plan.updates_actor(s) for s in (1, 3, 4)] == [False, False, True]


@pytest.mark.parametrize(
    ("overrides", "ahead", "depth", "tunable", "staleness", "admission", "apply"),
    [
        (["trainer.mode=sync", "trainer.async_buffer=3"], False, 0, False, None, False, None),
        (["trainer.mode=one_step_off", "trainer.async_buffer=3"], True, 1, False, None, False, "after_drain"),
        (
            ["trainer.mode=async", "trainer.async_buffer=3", "trainer.max_staleness=2"],
            True,
            3,
            True,
            2,
            True,
            None,
        ),
        (
            [
                "trainer.mode=async",
                "trainer.async_buffer=3",
                "trainer.staleness_control=drop",
                "trainer.max_staleness=1",
            ],
            True,
            3,
            True,
            1,
            False,
            None,
        ),
    ],
)
def test_what_the_trainer_mode_implies(
    overrides: list[str],
    ahead: bool,
    depth: int,
    tunable: bool,
    staleness: int | None,
    admission: bool,
    apply: str | None,
) -> None:
    plan = _plan(*overrides)
    assert (plan.generation_ahead, plan.batches_ahead, plan.tunable_depth) == (ahead, depth, tunable)
    assert (plan.max_staleness, plan.admission, plan.weight_apply) == (staleness, admission, apply)


def test_default_config_is_plain_grpo_and_the_plan_is_frozen() -> None:
    plan = plan_step(QuartetConfig())
    expected = StepPlan(
        old_logprobs=OldLogprobs.ACTOR_PASS,  # the demo: train_batch_size 8 over mini-batches of 4
        ref_logprobs=RefLogprobs.NONE,
        critic=False,
        reward_model=False,
        kl_in_reward=False,
        kl_loss=False,
        dynamic_sampling=False,
        greedy_baseline=False,
        sleep_rollout=True,
        critic_warmup=0,
        generation_ahead=False,  # trainer.mode=sync
        batches_ahead=0,
        tunable_depth=False,
        max_staleness=None,
        admission=False,
        weight_apply=None,
    )
    assert QuartetConfig().data.train_batch_size != QuartetConfig().actor.mini_batch_size
    assert plan == expected
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.critic = True  # type: ignore[misc]
