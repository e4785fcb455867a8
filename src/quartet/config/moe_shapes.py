"""What gpt-oss and DeepSeek-V3-style mixture-of-experts models do not run through yet, by `model_type`.

Both train through the roles (actor, reference, critic; padded and packed; FSDP2; checkpointing). What
quartet has not built for them is refused where it is first known, naming the missing piece and the key:

    shape_problems         LoRA, Ulysses SP, gpt-oss's ep    the tiny model's config, the loaded model
    rollout_gap            the built-in rollout engine       validate (tiny model), the engine at load
    SIGMOID_ROUTED         no load-balancing loss            validate (tiny model), the engine's router

- LoRA: peft knows the expert layout of Qwen2/3-MoE and Mixtral only. On gpt-oss it adapts the attention
  and silently none of the experts; on DeepSeek-V3 the MLA projections (`q_a_proj`, `kv_b_proj`, ...) are
  not in the default targets and the dense layers' MLP names go to the experts instead. Neither is what the
  targets say, and the weight sync and the planner do not count them.
- Sequence parallelism: the Ulysses path with MoE is checked against one process on Qwen-MoE attention;
  gpt-oss's sinks and windows and DeepSeek-V3's MLA under it are not, so both are refused.
- Expert parallelism: gpt-oss stores its experts transposed ([E, H, 2I], gate and up interleaved) with
  biases, which `engines.expert_parallel` does not split. DeepSeek-V3's routed experts are in the fused
  layout it splits (its router and shared expert run on each rank's tokens): it runs, exact against one
  process (tests/engines/test_expert_parallel_deepseek.py).
- The built-in rollout engine computes neither gpt-oss's attention sinks (nor its sliding-window layers) nor
  DeepSeek-V3's multi-head latent attention (MLA): rollout.engine=vllm serves both.
"""

from __future__ import annotations

from quartet.config.errors import ConfigError

__all__ = ["SHAPE_MODEL_TYPES", "SIGMOID_ROUTED", "rollout_gap", "shape_problems"]

SHAPE_MODEL_TYPES = ("gpt_oss", "deepseek_v3")
"""The `model_type`s of this module."""

SIGMOID_ROUTED = ("deepseek_v3",)
"""Models whose router scores experts by sigmoid with a correction bias: no load-balancing loss to weigh."""

_ROLLOUT_GAP = {
    "gpt_oss": "attention sinks and sliding-window layers",
    "deepseek_v3": "MLA attention (multi-head latent attention)",
}


def rollout_gap(model_type: str) -> str:
    """What of `model_type`'s forward the built-in rollout engine does not compute ('' when nothing)."""
    return _ROLLOUT_GAP.get(model_type, "")


def shape_problems(
    model_type: str, ep: int = 1, lora_rank: int = 0, section: str = "model", sp: int = 1
) -> list[ConfigError]:
    """LoRA or sequence parallelism on a gpt-oss or DeepSeek-V3 model, expert parallelism on gpt-oss (see
    the module doc); keys relative to `section`, fixes with the full key."""
    if model_type not in SHAPE_MODEL_TYPES:
        return []
    out: list[ConfigError] = []
    if lora_rank:
        out.append(
            ConfigError(
                "lora.rank",
                f"is {lora_rank} on a {model_type} model: peft does not adapt its experts (and "
                f"{'MLA projections' if model_type == 'deepseek_v3' else 'their biases'}) as the target "
                "names say, and the weight sync does not merge them (docs/moe.md)",
                f"set {section}.lora.rank: 0 (train the full model)",
            )
        )
    if sp > 1:
        out.append(
            ConfigError(
                "sequence_parallel_size",
                f"is {sp} on a {model_type} model: Ulysses sequence parallelism has been checked against one "
                f"process on Qwen-MoE attention only, not on "
                f"{'attention sinks and sliding windows' if model_type == 'gpt_oss' else 'MLA attention'} "
                "(docs/moe.md)",
                f"set {section}.sequence_parallel_size: 1",
            )
        )
    if ep > 1 and model_type == "gpt_oss":
        out.append(
            ConfigError(
                "expert_parallel_size",
                f"is {ep} on a gpt_oss model: its experts are stored transposed ([E, H, 2I], gate and up "
                "interleaved) with biases, which expert parallelism does not split (docs/moe.md)",
                f"set {section}.expert_parallel_size: 1",
            )
        )
    return out
