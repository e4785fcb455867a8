"""The planner counts the rollout's weights under `rollout.quantization=fp8` at 1 byte per projection weight
plus a float32 scale per output channel, as the engine's tensors measure; the config key refuses an
unknown value naming itself and the choices."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quartet.config import ConfigError, RolloutQuantization, load_config
from quartet.config.roles import Role
from quartet.config.rollout import FP8_PROJECTIONS, RolloutConfig
from quartet.models.loading import load_causal_lm
from quartet.planning.estimate import estimate_memory
from quartet.planning.plan import Phase
from quartet.rollout import TorchRolloutEngine


def _rollout_weights(model: Path, quantization: str) -> int:
    cfg = load_config(
        None, [f"model.path={model}", "rollout.dtype=bfloat16", f"rollout.quantization={quantization}"]
    )
    rows = [r for r in estimate_memory(cfg, device="gpu").rows if r.role is Role.ROLLOUT]
    assert {r.phase for r in rows} >= {Phase.GEN}
    weights = {r.breakdown["weights"] for r in rows}
    assert len(weights) == 1  # the same in every phase
    return weights.pop()


def test_the_planned_rollout_weights_shrink_as_counted_by_hand(tiny_model_dir: Path) -> None:
    model = load_causal_lm(tiny_model_dir)
    params = {n: p for n, p in model.named_parameters()}  # tied weights once, as the planner counts
    projections = [p for n, p in params.items() if n.endswith(tuple(f"{m}.weight" for m in FP8_PROJECTIONS))]
    assert len(projections) == len(FP8_PROJECTIONS) * model.config.num_hidden_layers
    total = sum(p.numel() for p in params.values())
    quantized = sum(p.numel() for p in projections)
    channels = sum(p.shape[0] for p in projections)
    bf16 = _rollout_weights(tiny_model_dir, "none")
    fp8 = _rollout_weights(tiny_model_dir, "fp8")
    assert bf16 == 2 * total
    assert fp8 == 2 * (total - quantized) + quantized + 4 * channels
    assert bf16 - fp8 == quantized - 4 * channels > 0


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "moe_model_dir"])
def test_the_plan_equals_the_fp8_engines_tensors(model_fixture: str, request: pytest.FixtureRequest) -> None:
    """Dense Qwen2, and Qwen3-MoE (its attention in fp8; the fused experts and the router stay bf16)."""
    model_dir: Path = request.getfixturevalue(model_fixture)
    with TorchRolloutEngine.from_pretrained(
        model_dir, dtype=torch.bfloat16, max_num_seqs=2, quantization="fp8"
    ) as engine:
        held = {id(t): t.nbytes for t in [*engine.model.parameters(), *engine.model.buffers()]}
        float_buffers = sum(t.nbytes for t in engine.model.buffers() if t.dtype == torch.float32)
    scales = sum(t.nbytes for n, t in engine.model.named_buffers() if n.endswith("weight_scale"))
    rotary = float_buffers - scales  # the rotary embedding's inverse frequencies: not weights
    assert sum(held.values()) - rotary == _rollout_weights(model_dir, "fp8")
    assert scales > 0


def test_an_unknown_quantization_names_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"(?s)rollout.quantization.*'int3'.*\['none', 'fp8'\]"):
        load_config(None, ["rollout.quantization=int3"])
    with pytest.raises(ConfigError, match=r"(?s)quantization.*\['none', 'fp8'\]"):
        RolloutConfig(quantization="int3")  # type: ignore[arg-type]
    assert load_config(None, ["rollout.quantization=FP8"]).rollout.quantization is RolloutQuantization.FP8


def test_fp8_with_the_vllm_engine_is_refused_until_its_syncs_are_checked() -> None:
    with pytest.raises(
        ConfigError, match=r"rollout.quantization: fp8 with rollout.engine=vllm is not supported"
    ):
        load_config(None, ["rollout.quantization=fp8", "rollout.engine=vllm"])
