"""`role_specs`/`run_values`: each role gets its own config section, never the whole config."""

from __future__ import annotations

from quartet.config import QuartetConfig, load_config, plan_step
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.roles.reference import Reference
from quartet.roles.reward_model import RewardModel
from quartet.roles.rollout import Rollout
from quartet.roles.run_values import RunValues
from quartet.trainer.workers.start import role_specs, run_values


def test_each_role_of_the_plan_gets_its_own_section_and_the_run_values() -> None:
    cfg = load_config(
        None,
        [
            "algorithm.adv_estimator=gae",
            "actor.use_kl_loss=true",
            "reward.model_path=/models/rm",
            "actor.mixed_precision=float32",
            "data.train_batch_size=6",
            "rollout.n=3",
            "trainer.seed=11",
        ],
        check=False,
    )
    plan = plan_step(cfg)
    specs = role_specs(cfg, plan, run_values(cfg, "/models/policy", total_steps=5))
    assert tuple(specs) == plan.roles == ("actor", "rollout", "reference", "critic", "reward_model")
    classes = {name: spec.cls for name, spec in specs.items()}
    assert classes == {
        "actor": Actor,
        "rollout": Rollout,
        "reference": Reference,
        "critic": Critic,
        "reward_model": RewardModel,
    }
    sections = {"actor": cfg.actor, "rollout": cfg.rollout, "reference": cfg.reference, "critic": cfg.critic}
    for name, section in sections.items():
        assert specs[name].args[0] is section, name
    assert specs["reward_model"].args[0] is cfg.reward
    for spec in specs.values():
        assert not any(isinstance(v, QuartetConfig) for v in (*spec.args, *spec.kwargs.values()))
    run = specs["actor"].args[1]
    assert run == RunValues(
        "/models/policy",
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        prompts_per_step=6,
        responses_per_prompt=3,
        seed=11,
        trainer_steps=5,
    )
    assert specs["reference"].args[2] == specs["reward_model"].args[2] == cfg.actor.mixed_precision


def test_routing_replay_reaches_the_rollout_and_the_reference() -> None:
    """`actor.routing_replay=rollout` implies the engine's record (the rollout's section says so) and the
    reference's replay; the actor reads its own section."""
    overrides = ["model.tiny.arch=qwen3_moe", "actor.use_kl_loss=true", "actor.routing_replay=rollout"]
    cfg = load_config(None, overrides)
    specs = role_specs(cfg, plan_step(cfg), run_values(cfg, "/models/policy", total_steps=5))
    assert not cfg.rollout.record_routing
    assert specs["rollout"].args[0].record_routing
    assert specs["reference"].args[3] is True
    off = load_config(None, overrides[:2])
    off_specs = role_specs(off, plan_step(off), run_values(off, "/models/policy", total_steps=5))
    assert off_specs["rollout"].args[0] is off.rollout and off_specs["reference"].args[3] is False


def test_the_modules_a_host_imports_early_are_those_of_the_role_classes() -> None:
    """`quartet train` tells early hosts to import `ROLE_MODULES[role]`: each must be its class's module."""
    from quartet.cluster.early_hosts import ROLE_MODULES
    from quartet.config.roles import Role

    cfg = load_config(
        None,
        [
            "algorithm.adv_estimator=gae",
            "actor.use_kl_loss=true",
            "reward.model_path=/models/rm",
            "teacher.model_path=/models/teacher",
            "algorithm.distill_coef=1.0",
        ],
        check=False,
    )
    specs = role_specs(cfg, plan_step(cfg), run_values(cfg, "/models/policy"))
    assert set(specs) == set(Role)  # every role is covered
    assert {role: spec.cls.__module__ for role, spec in specs.items()} == ROLE_MODULES
