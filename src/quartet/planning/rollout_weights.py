"""Bytes of the rollout engine's copy of the policy, by `rollout.dtype` and `rollout.quantization`.

With `quantization=fp8` the decoder layers' projections (`config.rollout.FP8_PROJECTIONS`, as the engine
quantizes them: `quartet.rollout.torch.fp8`) take 1 byte per weight plus a float32 scale per output channel;
everything else (embeddings, output head, norms, biases, MoE routers and fused experts, a vision tower)
stays in `rollout.dtype`. vLLM's own fp8 mode may quantize more than that (its MoE experts), so for it the
figure is an upper bound.
"""

from __future__ import annotations

from quartet.config.rollout import FP8_PROJECTIONS, RolloutQuantization
from quartet.planning.model_shape import ModelShape

__all__ = ["FP8_SCALE_BYTES", "fp8_projection_sizes", "rollout_weight_bytes"]

FP8_SCALE_BYTES = 4
"""One float32 scale per output channel of each fp8 weight."""


def fp8_projection_sizes(shape: ModelShape) -> tuple[int, int]:
    """(weights, output channels) of the projections fp8 stores, over all decoder layers of `shape`."""
    weights = channels = 0
    for name, fan_in, fan_out, layers in shape.linear_modules():
        if name in FP8_PROJECTIONS:
            weights += fan_in * fan_out * layers
            channels += fan_out * layers
    return weights, channels


def rollout_weight_bytes(shape: ModelShape, dtype_bytes: int, quantization: RolloutQuantization) -> int:
    """Bytes the rollout engine's weights take: all of `shape.params()` at `dtype_bytes`, or with fp8 its
    projections at 1 byte each plus `FP8_SCALE_BYTES` per output channel and the rest at `dtype_bytes`."""
    total = shape.params()
    if quantization is RolloutQuantization.NONE:
        return dtype_bytes * total
    weights, channels = fp8_projection_sizes(shape)
    return dtype_bytes * (total - weights) + weights + FP8_SCALE_BYTES * channels
