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
