"""A tiny gpt-oss or DeepSeek-V3 run: what does not run is refused when the config loads, naming the key
and the missing piece (the built-in engine's attention, LoRA, expert parallelism, routing replay, a
load-balancing loss DeepSeek-V3 does not define); what runs loads."""

from __future__ import annotations

import pytest

from quartet.config import ConfigError, load_config

GPT_OSS = "model.tiny.arch=gpt_oss"
DSV3 = "model.tiny.arch=deepseek_v3"
VLLM = "rollout.engine=vllm"


def _problem(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=list(overrides))
    return str(info.value)


@pytest.mark.parametrize("arch", [GPT_OSS, DSV3])
def test_training_with_another_rollout_engine_loads(arch: str) -> None:
    runs = [arch, VLLM, "model.remove_padding=true", "model.gradient_checkpointing=true"]
    if arch == DSV3:  # its routed experts split over ep (tests/engines/test_expert_parallel_deepseek.py)
        runs += ["model.expert_parallel_size=2", "cluster.bundles_per_node=2"]
    cfg = load_config(overrides=runs)
    assert cfg.model.tiny.arch.is_moe


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ((GPT_OSS,), ("rollout.engine", "attention sinks", "rollout.engine=vllm")),
        ((DSV3,), ("rollout.engine", "MLA attention", "rollout.engine=vllm")),
        ((GPT_OSS, VLLM, "model.lora.rank=4"), ("lora.rank", "gpt_oss", "model.lora.rank: 0")),
        ((DSV3, VLLM, "model.lora.rank=4"), ("lora.rank", "MLA projections", "model.lora.rank: 0")),
        (
            (GPT_OSS, VLLM, "model.expert_parallel_size=2"),
            ("expert_parallel_size", "transposed", "model.expert_parallel_size: 1"),
        ),
        ((GPT_OSS, VLLM, "model.tensor_parallel_size=2"), ("tensor_parallel_size", "mixture-of-experts")),
        ((DSV3, VLLM, "model.sequence_parallel_size=2"), ("sequence_parallel_size", "MLA attention")),
        ((GPT_OSS, VLLM, "model.sequence_parallel_size=2"), ("sequence_parallel_size", "sinks")),
        ((DSV3, VLLM, "actor.moe_aux_loss_coef=0.01"), ("actor.moe_aux_loss_coef", "no load-balancing loss")),
        (
            (DSV3, VLLM, "algorithm.adv_estimator=gae", "critic.moe_aux_loss_coef=0.01"),
            ("critic.moe_aux_loss_coef", "set critic.moe_aux_loss_coef to 0 or null"),
        ),
        ((GPT_OSS, "actor.routing_replay=rollout"), ("actor.routing_replay", "gpt_oss", "Qwen3-MoE kind")),
        ((DSV3, "rollout.record_routing=true"), ("rollout.record_routing", "deepseek_v3")),
    ],
)
def test_what_does_not_run_is_refused_naming_the_key(
    overrides: tuple[str, ...], names: tuple[str, ...]
) -> None:
    message = _problem(*overrides)
    for name in names:
        assert name in message, (name, message)


def test_deepseek_aux_coefficient_zero_or_null_loads() -> None:
    load_config(overrides=[DSV3, VLLM, "actor.moe_aux_loss_coef=0"])
    load_config(overrides=[DSV3, VLLM, "actor.moe_aux_loss_coef=null"])
