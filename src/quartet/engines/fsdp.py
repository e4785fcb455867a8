"""FSDP2 sharding of the engine's model: the last step of its build (`engines.build`).

Sharding follows the FSDP2 recipe: `fully_shard` on each decoder layer, then on the root, so each layer's
parameters are all-gathered just before it runs and freed after. Weights stay float32; mixed precision is
done by autocast around the forward (the same on CPU and GPU) rather than by FSDP's MixedPrecisionPolicy.
FSDP2 shards over every rank, or over "dp" only when tensor parallelism has split the layers over "tp"
(see `dist` for what that means for the gradient's averaging).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import fully_shard

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
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module
