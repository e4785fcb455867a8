"""Tensor parallelism of a causal LM with PyTorch's DTensor API (`model.tensor_parallel_size`).

A tensor group is tp consecutive ranks ("tp" of the ("dp", "tp") mesh, see `dist`). They take the same
rows (`row_group` pools them, as sequence parallelism does) and each holds a slice of every layer:

    self_attn.q_proj, k_proj, v_proj   ColwiseParallel: output features split -> heads / tp query and
                                       key/value heads per rank (biases split the same way: Qwen2)
    self_attn.o_proj                   RowwiseParallel: input features split, outputs all-reduced
    mlp.gate_proj, up_proj             ColwiseParallel: intermediate features split
    mlp.down_proj                      RowwiseParallel
    embed_tokens                       RowwiseParallel: vocabulary rows split, outputs all-reduced
    lm_head                            ColwiseParallel with its output left sharded by vocabulary

transformers' attention reshapes projections with -1 heads, so each rank attends with its local heads; the
query/key-value ratio (GQA) is unchanged. Qwen3's per-head q_norm/k_norm act on head_dim (not split) but
see only this rank's heads, so they get `SequenceParallel` on the heads dimension: replicated DTensor
weights whose gradients DTensor sums over the group (without it each rank kept its heads' part only).
The other norms stay replicated over "tp" (each rank sees the full hidden states after every all-reduce
and computes their full gradient). FSDP2 then shards everything over "dp" (`fsdp.shard`).

A tied embedding/lm_head stays tied: both are split by vocabulary rows the same way, and the lm_head is
pointed at the embedding's DTensor parameter, so the one parameter collects both gradients.

The logits stay sharded by vocabulary: `VocabHead` turns this rank's slice into log-probs and entropy with
`engines.vocab_parallel` (a few all-reduces of [rows] tensors, never the [rows, V] logits).

Gradient clipping: after FSDP2, parameters are DTensors on two meshes (("dp", "tp") for split layers,
"dp" for replicated ones). `clip_grad_norm` sums the squares of the local shards per kind of placement and
all-reduces each sum over the mesh dimensions that SPLIT it (not those that replicate it), so the norm
equals one process's norm.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from quartet.engines.dist import DistContext
from quartet.engines.fused_head import HeadRequest
from quartet.engines.hf_modules import decoder_layers, hf_model, lm_head, module_name
from quartet.engines.ulysses import SeqGroup
from quartet.engines.vocab_parallel import (
    GroupReduce,
    vocab_parallel_entropy,
    vocab_parallel_logprobs,
    vocab_slice,
)

__all__ = [
    "TP_MODEL_TYPES",
    "VocabHead",
    "clip_grad_norm",
    "fused_head_allowed",
    "layer_plan",
    "parallelize",
    "row_group",
]

log = logging.getLogger(__name__)

TP_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""transformers `model_type`s with a tensor-parallel plan (their decoder layers share module names)."""


def layer_plan() -> dict[str, ParallelStyle]:
    """The plan of one decoder layer of the `TP_MODEL_TYPES` (module path inside the layer -> style)."""
    plan: dict[str, ParallelStyle] = {
        f"self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")
    }
    plan["self_attn.o_proj"] = RowwiseParallel()
    plan.update({f"mlp.{n}": ColwiseParallel() for n in ("gate_proj", "up_proj")})
    plan["mlp.down_proj"] = RowwiseParallel()
    return plan


def _has(module: nn.Module, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def parallelize(module: nn.Module, mesh: DeviceMesh) -> None:
    """Split `module`'s decoder layers, embedding and lm_head over the 1-D "tp" `mesh` (in place).

    The model's type has a plan and tp divides its heads: the build checked it (`model_check`)."""
    model = hf_model(module)
    for layer in decoder_layers(module):
        plan = layer_plan()
        for norm in ("self_attn.q_norm", "self_attn.k_norm"):  # Qwen3: per head, on this rank's heads
            if _has(layer, norm):
                plan[norm] = SequenceParallel(sequence_dim=2, use_local_output=True)
        parallelize_module(layer, mesh, plan)
    embed = model.get_input_embeddings()
    head = lm_head(model)
    tied = head.weight is embed.weight
    ends: dict[str, ParallelStyle] = {
        module_name(model, embed): RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        module_name(model, head): ColwiseParallel(output_layouts=Shard(-1), use_local_output=True),
    }
    parallelize_module(model, mesh, ends)
    if tied:  # both were split by vocabulary rows the same way: share the embedding's parameter again
        lm_head(model).weight = model.get_input_embeddings().weight


def row_group(ctx: DistContext) -> SeqGroup | None:
    """This rank's tensor group as the group whose rows are pooled (None without tensor parallelism)."""
    if ctx.tp_mesh is None:
        return None
    return SeqGroup(size=ctx.tp, rank=ctx.tp_mesh.get_local_rank("tp"), group=ctx.group("tp"))


@dataclass(frozen=True)
class VocabHead:
    """This rank's vocabulary slice of the LM head and the reductions over its tensor group."""

    start: int
    reduce: GroupReduce

    @classmethod
    def of(cls, module: nn.Module, ctx: DistContext) -> VocabHead | None:
        """The vocabulary-parallel head of `module` under tensor parallelism (None without it)."""
        if ctx.tp_mesh is None:
            return None
        weight = lm_head(hf_model(module)).weight
        assert isinstance(weight, torch.Tensor)
        vocab = int(weight.shape[0])  # the global (DTensor) shape
        start, _ = vocab_slice(vocab, ctx.tp, ctx.tp_mesh.get_local_rank("tp"))
        return cls(start=start, reduce=GroupReduce(ctx.group("tp")))

    def outputs(
        self, logits: torch.Tensor, targets: torch.Tensor, request: HeadRequest
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs [b, K] of `targets` and entropy (or None) from this rank's logits [b, K, V / tp]."""
        logprobs = vocab_parallel_logprobs(logits, targets, request.temperature, self.start, self.reduce)
        entropy = None
        if request.with_entropy:
            with torch.set_grad_enabled(torch.is_grad_enabled() and request.entropy_grad):
                entropy = vocab_parallel_entropy(logits, request.temperature, self.reduce)
        return logprobs, entropy


def fused_head_allowed(wanted: bool, vocab: VocabHead | None) -> bool:
    """`wanted`, except under tensor parallelism: the fused head needs the whole lm_head (logged)."""
    if wanted and vocab is not None:
        log.info("model.fused_head is off under tensor parallelism: the vocabulary-parallel head is used")
        return False
    return wanted


def _split_dims(t: DTensor) -> tuple[tuple[str, ...], Any]:
    """The mesh dimensions that split `t` (not those that replicate it), and its mesh."""
    names = t.device_mesh.mesh_dim_names or ()
    return tuple(n for n, p in zip(names, t.placements, strict=True) if not p.is_replicate()), t.device_mesh


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Global L2 norm of the gradients of DTensor (and plain) parameters, clipped to `max_norm`."""
    grads = [p.grad for p in params if p.grad is not None]
    sums: dict[tuple[str, ...], list[Any]] = {}
    for g in grads:
        local = g.to_local() if isinstance(g, DTensor) else g
        dims, mesh = _split_dims(g) if isinstance(g, DTensor) else ((), None)
        square = local.detach().double().pow(2).sum()
        entry = sums.setdefault(dims, [torch.zeros((), dtype=torch.float64, device=square.device), mesh])
        entry[0] = entry[0] + square
    total = 0.0
    for dims, (square, mesh) in sums.items():
        for dim in dims:  # one all-reduce per splitting dimension
            dist.all_reduce(square, op=dist.ReduceOp.SUM, group=mesh.get_group(dim))
        total += float(square)
    norm = math.sqrt(total)
    if math.isfinite(norm) and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for g in grads:
            g.mul_(coef)
    return norm
