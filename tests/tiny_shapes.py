"""The tiny gpt-oss and DeepSeek-V3 of the MoE shape tests (the `moe_shape_dir` fixture builds them)."""

from __future__ import annotations

from typing import Any

TINY_SHAPES: dict[str, dict[str, Any]] = {
    "gpt_oss": dict(hidden_size=64, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2),
    "deepseek_v3": dict(
        hidden_size=64, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32
    ),
}
"""gpt-oss: a sliding-window and a full layer, 4 biased experts, 2 per token. DeepSeek-V3: a dense layer
then 2 sparse ones of 8 experts in 2 groups and a shared expert, MLA."""


def tiny_shape_spec(arch: str) -> Any:
    """The `TinyModelConfig` of `arch` ("gpt_oss" or "deepseek_v3") with its `TINY_SHAPES` sizes."""
    from quartet.config import TinyModelConfig
    from quartet.config.model import TinyArch

    return TinyModelConfig(arch=TinyArch(arch), **TINY_SHAPES[arch])
