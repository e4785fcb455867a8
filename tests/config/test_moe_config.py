"""A mixture-of-experts policy in the config: tensor parallelism refused with key and fix, sequence
parallelism (and with expert parallelism) accepted, the router loss coefficients checked, verl's Megatron MoE
keys translated."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.config import ConfigError, load_config
from quartet.config.from_verl import translate

MOE = ["model.tiny.arch=qwen3_moe", "cluster.bundles_per_node=2"]


def test_tensor_parallelism_that_does_not_split_experts_is_refused() -> None:
    key = "model.tensor_parallel_size"
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*MOE, f"{key}=2"])
    text = str(err.value)
    assert key in text and "mixture-of-experts" in text and "set model.tensor_parallel_size: 1" in text
    load_config(overrides=[*MOE[1:], f"{key}=2"])  # the dense tiny model splits


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.sequence_parallel_size=2"],
        ["algorithm.adv_estimator=gae", "critic.sequence_parallel_size=2"],
        ["model.sequence_parallel_size=2", "model.expert_parallel_size=2"],
    ],
    ids=["sp2", "critic-sp2", "sp2-ep2"],
)
def test_sequence_parallelism_runs_on_a_mixture_of_experts(overrides: list[str]) -> None:
    # the router's statistics are summed over the sequence group (tests/engines/test_moe_sp_dist.py)
    cfg = load_config(overrides=[*MOE, *overrides])
    assert max(cfg.model.sequence_parallel_size, cfg.critic.sequence_parallel_size) == 2


def test_a_folder_moe_model_is_refused_when_the_engine_loads_it(moe_model_dir: Path) -> None:
    from transformers import AutoConfig

    from quartet.engines.model_check import check_model_layout

    config = AutoConfig.from_pretrained(moe_model_dir)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*mixture-of-experts"):
        check_model_layout(config, tp=2)
    check_model_layout(config, sp=2, section="critic")  # sequence parallelism runs
    check_model_layout(config, sp=2, ep=2)
    check_model_layout(config)


def test_router_coefficients_are_checked() -> None:
    cfg = load_config(overrides=["actor.moe_aux_loss_coef=0.01", "critic.moe_z_loss_coef=0.001"])
    assert (cfg.actor.moe_aux_loss_coef, cfg.actor.moe_z_loss_coef) == (0.01, 0.0)
    assert (cfg.critic.moe_aux_loss_coef, cfg.critic.moe_z_loss_coef) == (None, 0.001)
    with pytest.raises(ConfigError, match="actor.moe_aux_loss_coef"):
        load_config(overrides=["actor.moe_aux_loss_coef=-1"])
    with pytest.raises(ConfigError, match="actor.moe_z_loss_coef"):
        load_config(overrides=["actor.moe_z_loss_coef=-0.1"])


def test_verl_megatron_moe_coefficients_translate() -> None:
    prefix = "actor_rollout_ref.actor.megatron.override_transformer_config."
    t = translate(
        {
            f"{prefix}moe_aux_loss_coeff": 0.01,
            f"{prefix}moe_z_loss_coeff": 0.001,
            "critic.megatron.override_transformer_config.moe_aux_loss_coeff": 0.02,
        },
        verl_defaults=False,
    )
    assert t.quartet_values["actor.moe_aux_loss_coef"] == 0.01
    assert t.quartet_values["actor.moe_z_loss_coef"] == 0.001
    assert t.quartet_values["critic.moe_aux_loss_coef"] == 0.02
