"""The loaded model against the engine's parallel layout: the one check that needs the model itself.

The config checks the parallel sizes as numbers once (`quartet.config.parallel`): on their own, against the
pool, and against the tiny model's heads when the run builds it. A model from a folder is known only once
loaded; this module applies the same rules to its real head and expert counts and adds what only the model
tells: whether tensor parallelism has a plan for its type, whether it is a vision-language model, and
whether it is a mixture of experts (`num_experts`, Mixtral's and gpt-oss's `num_local_experts`, DeepSeek's
`n_routed_experts`), and what a gpt-oss or DeepSeek-V3 model does not run with (`config.moe_shapes`).
"""

from __future__ import annotations

from typing import Any

from quartet.config.moe_shapes import shape_problems
from quartet.config.parallel import expert_problems, head_problems, moe_problems, vision_problem
from quartet.engines.tensor_parallel import TP_MODEL_TYPES

__all__ = ["check_model_layout"]


def check_model_layout(
    config: Any,
    sp: int = 1,
    tp: int = 1,
    ep: int = 1,
    *,
    vision: bool = False,
    section: str = "model",
    lora_rank: int = 0,
) -> None:
    """Refuse a model that the sequence (`sp`), tensor (`tp`) or expert (`ep`) parallel size cannot split.

    Args:
        config: the loaded transformers model's config (`model_type`, `num_attention_heads`,
            `num_key_value_heads`, `num_experts` or `num_local_experts` for a mixture of experts; a
            vision-language model's under `text_config`).
        vision: the model is a vision-language model.
        section: the config section whose sizes these are (`model`, or `critic` for the critic's own sp),
            named by the errors.
        lora_rank: the engine's LoRA rank (gpt-oss and DeepSeek-V3 refuse LoRA: `config.moe_shapes`).
    """
    problem = vision_problem(sp, section) if vision else None
    if problem is not None:
        raise problem.under(section)
    is_moe = bool(
        getattr(config, "num_experts", None)
        or getattr(config, "num_local_experts", None)
        or getattr(config, "n_routed_experts", None)
    )
    moe = moe_problems(tp, section) if is_moe else []
    if moe:
        raise moe[0].under(section)
    kind = getattr(config, "model_type", "?")
    if tp > 1 and kind not in TP_MODEL_TYPES:
        raise ValueError(
            f"{section}.tensor_parallel_size={tp}: no tensor-parallel plan for model type '{kind}' "
            f"(planned: {', '.join(TP_MODEL_TYPES)}); set {section}.tensor_parallel_size: 1"
        )
    text = config.text_config if vision else config  # a VLM's heads are its language model's
    heads = int(text.num_attention_heads)
    kv = int(getattr(text, "num_key_value_heads", None) or heads)
    experts = int(
        getattr(text, "num_experts", None)
        or getattr(text, "num_local_experts", None)
        or getattr(text, "n_routed_experts", None)
        or 0
    )
    problems = head_problems(heads, kv, sp, tp) + expert_problems(experts, ep)
    problems += shape_problems(kind, ep, lora_rank, section, sp)
    if problems:
        raise problems[0].under(section)
