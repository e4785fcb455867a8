"""FSDP2 sharding of the engine's model: the last step of its build (`engines.build`).

Sharding follows the FSDP2 recipe: `fully_shard` on each decoder layer, then on the root, so each layer's
parameters are all-gathered just before it runs and freed after. Weights stay float32; mixed precision is
done by autocast around the forward (the same on CPU and GPU) rather than by FSDP's MixedPrecisionPolicy.
FSDP2 shards over every rank, or over "dp" only when tensor parallelism has split the layers over "tp"
(see `dist` for what that means for the gradient's averaging). Under expert parallelism each decoder
layer's experts (already split by expert over "ep", `expert_parallel`) are sharded first, on their own,
over "edp": the ranks that hold the same experts; the rest of the layer over every rank.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from quartet.engines.dist import DistContext
from quartet.engines.hf_modules import decoder_layers

__all__ = ["shard"]


def shard(module: nn.Module, ctx: DistContext) -> nn.Module:
    """`module` (on the device, parallelised if asked) sharded by FSDP2 with world > 1: per decoder layer,
    then the root. With one rank it stays a plain module."""
    if not ctx.sharded:
        return module
    mesh = ctx.mesh if ctx.tp_mesh is None else ctx.tp_mesh["dp"]
    for layer in decoder_layers(module):
        if ctx.ep_mesh is not None:
            for experts in _split_by_expert(layer):
                fully_shard(experts, mesh=ctx.ep_mesh["edp"])
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def _split_by_expert(layer: nn.Module) -> list[nn.Module]:
    """The modules of `layer` whose own parameters are split over "ep" (`expert_parallel.ParallelExperts`),
    found by their placement so that this step needs nothing from the previous one."""
    return [
        m
        for m in layer.modules()
        if any(
            isinstance(p, DTensor) and p.device_mesh.mesh_dim_names == ("ep",)
            for p in m.parameters(recurse=False)
        )
    ]
