"""Ulysses sequence parallelism on packed micro-batches (`model.sequence_parallel_size`).

A sequence group is `sp` consecutive ranks that take the SAME micro-batch: each rank receives its own rows
as with data parallelism, and the group pools them first (`group_rows`). The engine packs a micro-batch
(`engines.packing`), pads the packed length N up to a multiple of sp, and each rank runs the model on its
contiguous slice of N / sp tokens: embeddings, projections, MLPs and the head see only the local tokens,
so the activations of a row are divided by sp. Attention needs every token of a row, so around it two
all-to-alls swap what is split (DeepSpeed-Ulysses):

    [local tokens, all heads]  --all-to-all-->  [all tokens, heads / sp]  (packed causal attention per row)
    [all tokens, heads / sp]   --all-to-all-->  [local tokens, all heads]

The backward of one all-to-all is the other, so autograd needs no other collective. Key/value heads that
sp does not divide (GQA with few KV heads) are repeated up to the query heads first.

The head's per-token outputs (log-probs, entropy; a value model's values) of the local tokens are then
gathered over the group (`gather_outputs`), so every rank of the group sees the whole micro-batch's outputs
and computes the same loss as without SP. Gradient: rank r's outputs reach that loss only through its own
slice of the gather, so the gather's backward keeps this rank's slice of the incoming gradient (no sum).
Each rank's parameter gradient is then its share of d loss / d theta (the all-to-all backward hands the
other ranks their parts), and the sum over the group is the whole gradient; FSDP's mean over all ranks is
undone by the world size as with data parallelism only (see `dist`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from transformers import PreTrainedModel

from quartet.core.batch import Batch
from quartet.engines.dist import DistContext
from quartet.engines.packing import PackedInputs, varlen_attention

__all__ = [
    "ULYSSES",
    "SeqGroup",
    "SeqShard",
    "gather_outputs",
    "group_rows",
    "heads_to_seq",
    "local_share",
    "padded_length",
    "register_ulysses_attention",
    "seq_group",
    "seq_to_heads",
    "shard_packed",
    "slice_bounds",
    "slice_mask",
    "sum_over_group",
    "ulysses_attention",
    "use_ulysses_attention",
]

ULYSSES = "quartet_ulysses"
"""The attention implementation name of a packed model under sequence parallelism."""


@dataclass(frozen=True)
class SeqGroup:
    """This rank's sequence group: its size, this rank's place in it, and its process group."""

    size: int
    rank: int
    group: Any = None
    """A `torch.distributed` process group; None only with size 1 (no collective is issued)."""


def seq_group(ctx: DistContext) -> SeqGroup | None:
    """This rank's sequence group (None without sequence parallelism)."""
    if ctx.sp_mesh is None:
        return None
    return SeqGroup(size=ctx.sp, rank=ctx.sp_mesh.get_local_rank("sp"), group=ctx.group("sp"))


def group_rows(batch: Batch, group: SeqGroup | None) -> tuple[Batch, slice]:
    """The rows of every rank of the group in rank order, and where this rank's own rows sit among them.

    Rows are dealt to ranks over the whole world (as with data parallelism only); the ranks of a sequence
    group must run the same micro-batches, so they first pool their rows. Without SP: `batch` itself."""
    if group is None or group.size == 1:
        return batch, slice(0, len(batch))
    parts: list[Any] = [None] * group.size
    dist.all_gather_object(parts, batch.to("cpu"), group=group.group)
    start = sum(len(p) for p in parts[: group.rank])
    return Batch.concat(parts), slice(start, start + len(batch))


def padded_length(n: int, sp: int) -> int:
    """The packed length n rounded up to a multiple of sp (every rank gets the same number of tokens)."""
    if sp < 1:
        raise ValueError(f"sequence parallel size must be >= 1, got {sp}")
    return -(-n // sp) * sp


def slice_bounds(n: int, sp: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank's contiguous slice of a packed sequence of n tokens padded for sp ranks."""
    if not 0 <= rank < sp:
        raise ValueError(f"rank {rank} outside a sequence group of {sp}")
    share = padded_length(n, sp) // sp
    return rank * share, (rank + 1) * share


@dataclass(frozen=True)
class SeqShard:
    """This rank's part of a packed micro-batch (`PackedInputs`) under sequence parallelism."""

    input_ids: torch.Tensor
    """[1, n] this rank's slice of the packed tokens (padded with token 0 past the real ones)."""
    position_ids: torch.Tensor
    """[1, n] their positions within their rows."""
    bounds: tuple[int, ...]
    """The global row bounds, with the padding as one more span up to the padded length."""
    keep: torch.Tensor
    """Local indices of this slice's positions whose logits predict a response token."""
    targets: torch.Tensor
    """[len(keep)] the tokens they predict."""
    counts: tuple[int, ...]
    """Kept positions of each rank of the group (what `gather_outputs` joins)."""
    group: SeqGroup | None = None
    """The sequence group (None: the whole micro-batch on this rank, no SP)."""

    @property
    def model_kwargs(self) -> dict[str, Any]:
        """What the model forwards to the attention function besides the bounds."""
        return {} if self.group is None else {"quartet_sp": self.group}

    def gather(
        self, logprobs: torch.Tensor, entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """[1, local K] head outputs -> [1, K] of the whole micro-batch (unchanged without SP)."""
        if self.group is None:
            return logprobs, entropy
        group = self.group
        lp = gather_outputs(logprobs[0], self.counts, group).unsqueeze(0)
        return lp, None if entropy is None else gather_outputs(entropy[0], self.counts, group).unsqueeze(0)


def local_share(packed: PackedInputs, group: SeqGroup | None) -> SeqShard:
    """This rank's share of a packed micro-batch: all of it without SP, else its slice (`shard_packed`)."""
    if group is None:
        keep = packed.keep
        return SeqShard(
            packed.input_ids, packed.position_ids, packed.bounds, keep, packed.targets, (int(keep.numel()),)
        )
    return shard_packed(packed, group)


def shard_packed(packed: PackedInputs, group: SeqGroup) -> SeqShard:
    """This rank's contiguous slice of a packed micro-batch, padded so every rank gets as many tokens."""
    n = packed.input_ids.shape[1]
    total = padded_length(n, group.size)
    pad = total - n
    ids = torch.nn.functional.pad(packed.input_ids, (0, pad))
    pos = torch.nn.functional.pad(packed.position_ids, (0, pad))
    start, end = slice_bounds(n, group.size, group.rank)
    slices = [slice_bounds(n, group.size, r) for r in range(group.size)]
    counts = tuple(int(((packed.keep >= a) & (packed.keep < z)).sum()) for a, z in slices)
    inside = (packed.keep >= start) & (packed.keep < end)
    return SeqShard(
        input_ids=ids[:, start:end],
        position_ids=pos[:, start:end],
        bounds=packed.bounds + ((total,) if pad else ()),
        keep=packed.keep[inside] - start,
        targets=packed.targets[inside],
        counts=counts,
        group=group,
    )


def _all_to_all(x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
    """Chunk j of dim 0 goes to rank j; chunk i of the result came from rank i."""
    if group.size == 1:
        return x
    x = x.contiguous()  # the collective reads and writes flat memory: no strided views on either side
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x, group=group.group)
    return out


def _seq_to_heads(x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
    n, h, d = x.shape
    sp = group.size
    chunks = x.reshape(n, sp, h // sp, d).transpose(0, 1)  # [sp, n, h/sp, d]: head group j for rank j
    return _all_to_all(chunks, group).reshape(sp * n, h // sp, d)  # rank i's tokens i-th


def _heads_to_seq(x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
    n_all, hl, d = x.shape
    sp = group.size
    chunks = x.reshape(sp, n_all // sp, hl, d)  # token slice j for rank j
    got = _all_to_all(chunks, group)  # [sp, n, hl, d]: head group i from rank i
    return got.transpose(0, 1).reshape(n_all // sp, sp * hl, d)


class _SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
        ctx.group = group
        return _seq_to_heads(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _heads_to_seq(grad, ctx.group), None


class _HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
        ctx.group = group
        return _heads_to_seq(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _seq_to_heads(grad, ctx.group), None


def seq_to_heads(x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
    """[n local tokens, H, D] -> [sp * n tokens (rank order), H / sp, D], differentiable."""
    if x.shape[1] % group.size:
        raise ValueError(f"{x.shape[1]} heads cannot be split over a sequence group of {group.size}")
    out: torch.Tensor = _SeqToHeads.apply(x, group)  # type: ignore[no-untyped-call]
    return out


def heads_to_seq(x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
    """[sp * n tokens, H / sp, D] -> [n local tokens, H, D]: the inverse of `seq_to_heads`."""
    if x.shape[0] % group.size:
        raise ValueError(f"{x.shape[0]} tokens cannot be split over a sequence group of {group.size}")
    out: torch.Tensor = _HeadsToSeq.apply(x, group)  # type: ignore[no-untyped-call]
    return out


def ulysses_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    quartet_bounds: tuple[int, ...] | None = None,
    quartet_sp: SeqGroup | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: packed causal attention over the whole sequence of a group.

    query [1, Hq, n, D], key/value [1, Hkv, n, D] on this rank's n tokens -> ([1, n, Hq, D], None);
    `quartet_bounds` are the global row bounds (their last entry is the padded length sp * n).
    """
    if quartet_sp is None:
        raise ValueError(f"attention '{ULYSSES}' needs the sequence group (quartet_sp); the engine passes it")
    sp = quartet_sp.size
    hq, hkv = query.shape[1], key.shape[1]
    if hkv % sp:  # GQA with fewer (or indivisible) KV heads: every query head gets its own copy
        key, value = key.repeat_interleave(hq // hkv, dim=1), value.repeat_interleave(hq // hkv, dim=1)

    def scatter(t: torch.Tensor) -> torch.Tensor:  # [1, H, n, D] -> [1, H / sp, N, D]
        return seq_to_heads(t[0].transpose(0, 1), quartet_sp).transpose(0, 1).unsqueeze(0)

    out, _ = varlen_attention(
        module, scatter(query), scatter(key), scatter(value), None, scaling, dropout, quartet_bounds
    )  # [1, N, Hq / sp, D]
    return heads_to_seq(out[0], quartet_sp).unsqueeze(0), None


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, counts: tuple[int, ...], group: SeqGroup) -> torch.Tensor:
        ctx.counts = counts
        ctx.rank = group.rank
        width = max(counts)
        padded = torch.zeros(width, dtype=x.dtype, device=x.device)
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded, group=group.group)
        return torch.cat([p[:c] for p, c in zip(parts, counts, strict=True)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start = sum(ctx.counts[: ctx.rank])
        return grad[start : start + ctx.counts[ctx.rank]], None, None


def gather_outputs(x: torch.Tensor, counts: tuple[int, ...], group: SeqGroup) -> torch.Tensor:
    """[counts[rank]] per-token outputs of the local tokens -> [sum(counts)] in rank order, differentiable.

    Every rank of the group computes the same loss from the result; the backward keeps this rank's slice
    of the gradient (see the module doc)."""
    if group.size == 1:
        return x
    if x.shape[0] != counts[group.rank]:
        raise ValueError(f"rank {group.rank} holds {x.shape[0]} outputs, expected {counts[group.rank]}")
    out: torch.Tensor = _Gather.apply(x, counts, group)  # type: ignore[no-untyped-call]
    return out


class _SumOverGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SeqGroup) -> torch.Tensor:
        out = x.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sum_over_group(x: torch.Tensor, group: SeqGroup | None) -> torch.Tensor:
    """The sum of `x` over the ranks of the sequence group, differentiable (`x` unchanged without SP).

    Every rank of the group forms the same loss from the sum, as from `gather_outputs`, so the backward
    hands this rank the incoming gradient as it is: the rank's share of d loss / d theta is d loss / d sum
    times d x / d theta, and the shares of the group add up to the whole gradient. (An all-reduce of the
    gradient, torch.distributed.nn's backward, would make it sp times too large.)"""
    if group is None or group.size == 1:
        return x
    out: torch.Tensor = _SumOverGroup.apply(x, group)  # type: ignore[no-untyped-call]
    return out


def slice_mask(n: int, group: SeqGroup) -> torch.Tensor:
    """[padded n / sp] bool: which tokens of this rank's slice of a packed sequence of `n` real tokens are
    real (the tokens past n pad the sequence to a multiple of sp)."""
    start, end = slice_bounds(n, group.size, group.rank)
    return torch.arange(start, end) < n


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """The attention confines itself to each row: no mask tensor is built."""
    return None


def register_ulysses_attention() -> None:
    """Make `ULYSSES` a transformers attention implementation (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ULYSSES, ulysses_attention)
    AttentionMaskInterface.register(ULYSSES, _no_mask)


def use_ulysses_attention(model: PreTrainedModel) -> None:
    """Run `model`'s attention as `ULYSSES`: the packed attention (`packing`) over the whole sequence of the
    group, between the two all-to-alls. The engine's parallelise step (`engines.build`)."""
    register_ulysses_attention()
    model.config._attn_implementation = ULYSSES
