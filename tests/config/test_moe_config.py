"""A mixture-of-experts policy in the config: tensor and sequence parallelism refused with key and fix, the
router loss coefficients checked, verl's Megatron MoE keys translated."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.config import ConfigError, load_config
from quartet.config.from_verl import translate

MOE = ["model.tiny.arch=qwen3_moe", "cluster.bundles_per_node=2"]


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.tensor_parallel_size=2", "model.tensor_parallel_size"),
        ("model.sequence_parallel_size=2", "model.sequence_parallel_size"),
        ("critic.sequence_parallel_size=2", "critic.sequence_parallel_size"),
    ],
)
def test_parallelism_that_does_not_split_experts_is_refused(override: str, key: str) -> None:
    extra = ["algorithm.adv_estimator=gae"] if override.startswith("critic") else []
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[*MOE, *extra, override])
    text = str(err.value)
    assert key in text and "mixture-of-experts" in text and f"set {key.rsplit('.', 1)[0]}" in text
    load_config(overrides=[*MOE[1:], *extra, override])  # the dense tiny model splits


def test_a_folder_moe_model_is_refused_when_the_engine_loads_it(moe_model_dir: Path) -> None:
    from transformers import AutoConfig

    from quartet.engines.model_check import check_model_layout

    config = AutoConfig.from_pretrained(moe_model_dir)
    with pytest.raises(ConfigError, match="tensor_parallel_size.*mixture-of-experts"):
        check_model_layout(config, tp=2)
    with pytest.raises(ConfigError, match="sequence_parallel_size.*mixture-of-experts"):
        check_model_layout(config, sp=2, section="critic")
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
