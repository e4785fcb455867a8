"""The engine's module, built in one direction: the model, then its parallel split, then its sharding.

    1. model        `model_init.build_model`: the weights and head of `spec.kind`, the attention of packed
                    passes, gradient checkpointing, LoRA adapters, freezing; float32 on CPU.
       check        `model_check.check_model_layout`: the loaded model's heads (and type) against sp and tp.
       place        on this rank's device.
    2. parallelise  sequence parallelism: the Ulysses attention (`ulysses`) in place of the packed one;
                    tensor parallelism: the layers, embedding and LM head split over "tp" (`tensor_parallel`);
                    expert parallelism: each MoE layer's experts split over "ep" (`expert_parallel`).
    3. shard        FSDP2 over the data-parallel ranks (`fsdp`); experts over "edp".

Each step takes the module the previous one returned and none reaches back: the shared look-ups (the
transformers model inside a wrapper, its decoder layers) live in `hf_modules`, which imports no step.
"""

from __future__ import annotations

from torch import nn

from quartet.engines.dist import DistContext
from quartet.engines.expert_parallel import parallelize_experts
from quartet.engines.fsdp import shard
from quartet.engines.hf_modules import hf_model
from quartet.engines.model_check import check_model_layout
from quartet.engines.model_init import build_model
from quartet.engines.spec import EngineSpec, ModelKind
from quartet.engines.tensor_parallel import parallelize
from quartet.engines.ulysses import use_ulysses_attention
from quartet.models.vision import is_vision_module

__all__ = ["build_module"]


def build_module(spec: EngineSpec, ctx: DistContext) -> nn.Module:
    """The model of `spec` on `ctx`'s device, split by its sequence, tensor and expert parallel sizes and
    sharded."""
    module = build_model(spec)
    model = hf_model(module)
    section = "critic" if spec.kind is ModelKind.VALUE else "model"  # whose sizes the errors name
    sp = spec.sequence_parallel_size
    tp = spec.tensor_parallel_size
    ep = spec.expert_parallel_size
    lora = spec.lora.rank if spec.uses_lora and spec.lora is not None else 0
    vision = is_vision_module(model)
    check_model_layout(model.config, sp, tp, ep, vision=vision, section=section, lora_rank=lora)
    module.to(ctx.device)
    if sp > 1:
        use_ulysses_attention(model)
    if ctx.tp_mesh is not None:
        parallelize(module, ctx.tp_mesh["tp"])
    if ctx.ep_mesh is not None:
        parallelize_experts(module, ctx.ep_mesh["ep"])
    return shard(module, ctx)
