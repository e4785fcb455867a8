"""`model.expert_parallel_size`: what the config, the engine spec and the loaded-model check refuse, each
naming the key and the fix, and the verl key that maps to it. The exactness of the split itself is
test_expert_parallel_dist.py's."""

from __future__ import annotations

import pytest

from quartet.config import ModelConfig, TinyModelConfig, load_config
from quartet.config.errors import ConfigError
from quartet.config.from_verl import translate_overrides
from quartet.config.model import LoraConfig, TinyArch
from quartet.engines import EngineSpec, ModelKind
from quartet.engines.model_check import check_model_layout

MOE = TinyModelConfig(arch=TinyArch.QWEN3_MOE, num_experts=8)


def test_model_config_refuses_what_ep_cannot_split() -> None:
    assert ModelConfig(tiny=MOE, expert_parallel_size=4).expert_parallel_size == 4
    with pytest.raises(ConfigError, match="3 does not divide the tiny model's 8 experts") as info:
        ModelConfig(tiny=MOE, expert_parallel_size=3)
    assert "expert_parallel_size" in str(info.value) and "divisor of 8" in str(info.value)
    with pytest.raises(ConfigError, match="no experts \\(a dense model\\)") as info:
        ModelConfig(expert_parallel_size=2)  # the default tiny model is a dense Qwen2
    assert "model.expert_parallel_size: 1" in str(info.value)
    with pytest.raises(ConfigError, match="expert and tensor parallelism are not combined") as info:
        ModelConfig(tiny=MOE, expert_parallel_size=2, tensor_parallel_size=2)
    assert "model.tensor_parallel_size: 1" in str(info.value)
    with pytest.raises(ConfigError, match="LoRA"):
        ModelConfig(tiny=MOE, expert_parallel_size=2, lora=LoraConfig(rank=4))
    with pytest.raises(ConfigError, match="expert_parallel_size: must be >= 1"):
        ModelConfig(tiny=MOE, expert_parallel_size=0)
    # sequence parallelism composes with ep (the router's statistics are summed over the sequence group)
    both = ModelConfig(tiny=MOE, expert_parallel_size=2, sequence_parallel_size=2)
    assert (both.expert_parallel_size, both.sequence_parallel_size) == (2, 2)


def test_expert_parallel_size_must_divide_the_pool() -> None:
    ep = ["model.tiny.arch=qwen3_moe", "model.expert_parallel_size=2"]
    with pytest.raises(ConfigError) as info:
        load_config(overrides=ep)  # one device
    assert info.value.field == "model.expert_parallel_size"
    assert "[1]" in info.value.fix
    two = ["cluster.backend=ray", "cluster.bundles_per_node=2"]
    assert load_config(overrides=[*ep, *two]).model.expert_parallel_size == 2
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["model.tiny.arch=qwen3_moe", "model.expert_parallel_size=4", *two])
    assert info.value.field == "model.expert_parallel_size" and "2 devices" in info.value.problem


class _Config:
    model_type = "qwen3_moe"
    num_attention_heads = 4
    num_key_value_heads = 2

    def __init__(self, **experts: int) -> None:
        self.__dict__.update(experts)


def test_loaded_model_checks_name_the_key() -> None:
    check_model_layout(_Config(num_experts=8), ep=8)
    check_model_layout(_Config(num_local_experts=8), ep=2)  # Mixtral's name for it
    with pytest.raises(ValueError, match="expert_parallel_size: 4 does not divide the model's 6 experts"):
        check_model_layout(_Config(num_experts=6), ep=4)
    with pytest.raises(ValueError, match="no experts \\(a dense model\\)"):
        check_model_layout(_Config(), ep=2)
    check_model_layout(_Config(), ep=1)  # a dense model without ep


def test_spec_refuses_ep_outside_the_policy_and_with_tp() -> None:
    with pytest.raises(ValueError, match="policy \\(causal LM\\) only"):
        EngineSpec("m", ModelKind.VALUE, expert_parallel_size=2)
    with pytest.raises(ValueError, match="expert and tensor parallelism are not combined"):
        EngineSpec("m", ModelKind.CAUSAL_LM, expert_parallel_size=2, tensor_parallel_size=2)
    EngineSpec("m", ModelKind.CAUSAL_LM, expert_parallel_size=2)


def test_verl_expert_model_parallel_size_maps() -> None:
    t = translate_overrides(["actor_rollout_ref.actor.megatron.expert_model_parallel_size=2"])
    assert t.quartet_values["model.expert_parallel_size"] == 2
    ref = translate_overrides(["actor_rollout_ref.ref.megatron.expert_model_parallel_size=2"])
    assert ref.quartet_values["model.expert_parallel_size"] == 2
