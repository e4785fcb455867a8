"""Log-probs and entropy from logits sharded by vocabulary over a tensor group, without gathering them.

Under tensor parallelism (`engines.tensor_parallel`) the LM head is split by vocabulary: rank r of a
tensor group holds the logits z[..., v0:v1] of its slice only. With z scaled by the temperature,

    m       = max_v z                       (all-reduce MAX of the local maxima; no gradient needed)
    S       = sum_v exp(z - m)              (all-reduce SUM of the local sums)
    lse     = m + log S
    logp[y] = z[y] - lse                    (z[y]: the rank whose slice holds y contributes it, the others
                                             0; all-reduce SUM)
    H       = m + log S - U / S             (U = sum_v exp(z - m) z: all-reduce SUM; `core.entropy`'s form)

so one [rows] float per quantity crosses the group, never a [rows, V] tensor. Gradient: every rank of the
group computes the same loss from these replicated results and backpropagates it; d loss / d (local sum)
equals d loss / d (total sum), so the backward of each all-reduce SUM is the identity (`_ReduceSum`), and
autograd gives each rank the exact gradient of its own logits' slice. The max is a shift for stability
whose gradient cancels in lse, so it is detached.

The reductions are behind `VocabReduce`, so the shard-local math also runs in one process on a stack of
shards (the unit tests reduce over the stacking dimension) and can be checked against `engines.heads`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

__all__ = [
    "GroupReduce",
    "VocabReduce",
    "vocab_parallel_entropy",
    "vocab_parallel_logprobs",
    "vocab_slice",
]

_CHUNK = 1024  # positions per chunk (as `heads`): float32 copies of the local logits stay bounded


class VocabReduce(Protocol):
    """The two reductions over the vocabulary shards; their results are the same on every shard."""

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over shards, differentiable (backward: identity, see the module doc)."""
        ...

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """Max over shards, no gradient."""
        ...


class _ReduceSum(torch.autograd.Function):
    """All-reduce SUM over a process group; backward passes the gradient through unchanged."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, group: Any) -> torch.Tensor:
        out = t.contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


@dataclass(frozen=True)
class GroupReduce:
    """`VocabReduce` over a tensor group's process group."""

    group: Any

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce SUM (identity backward)."""
        out: torch.Tensor = _ReduceSum.apply(t, self.group)  # type: ignore[no-untyped-call]
        return out

    def max(self, t: torch.Tensor) -> torch.Tensor:
        """All-reduce MAX of a detached copy."""
        out = t.detach().contiguous().clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.group)
        return out


def vocab_slice(vocab: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of rank's vocabulary slice: DTensor's Shard(0) chunks of ceil(vocab / size) rows."""
    chunk = -(-vocab // size)
    return min(rank * chunk, vocab), min((rank + 1) * chunk, vocab)


def _lse(z: torch.Tensor, reduce: VocabReduce) -> torch.Tensor:
    """logsumexp over the whole vocabulary of float32 local logits z [..., v]."""
    m = reduce.max(z.max(dim=-1).values).detach()
    total = reduce.sum(torch.exp(z - m.unsqueeze(-1)).sum(dim=-1))
    return m + torch.log(total)


def _chunks(logits: torch.Tensor, chunk: int) -> tuple[torch.Size, list[torch.Tensor]]:
    """Flattened positions [..., N, v] cut in chunks along N (leading dims, e.g. stacked shards, kept)."""
    lead = logits.shape[:-1]
    flat = logits.reshape(*lead[:-2], lead[-2] * lead[-1], logits.shape[-1])
    return lead, list(torch.split(flat, chunk, dim=-2))


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    start: int | torch.Tensor,
    reduce: VocabReduce,
    chunk: int = _CHUNK,
) -> torch.Tensor:
    """Log-probs [..., b, K] (float32) of `targets` [b, K] from this shard's logits [..., b, K, v].

    `start` is the first vocabulary id of the shard (a tensor broadcasting against `targets` when shards
    are stacked in leading dimensions). Every shard returns the same values."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    lead, parts = _chunks(logits, chunk)
    local = targets - start  # the target's column in this shard, if it is there
    inside = (local >= 0) & (local < logits.shape[-1])
    index = torch.where(inside, local, 0).expand(lead)
    index = index.reshape(*lead[:-2], lead[-2] * lead[-1], 1)
    mask = inside.expand(lead).reshape(*lead[:-2], lead[-2] * lead[-1])
    out = []
    for z_raw, idx, ok in zip(
        parts, torch.split(index, chunk, dim=-2), torch.split(mask, chunk, dim=-1), strict=True
    ):
        z = z_raw.float() / temperature
        picked = torch.where(ok, z.gather(-1, idx).squeeze(-1), torch.zeros((), device=z.device))
        out.append(reduce.sum(picked) - _lse(z, reduce))
    return torch.cat(out, dim=-1).reshape(lead)


def vocab_parallel_entropy(
    logits: torch.Tensor, temperature: float, reduce: VocabReduce, chunk: int = _CHUNK
) -> torch.Tensor:
    """Entropy [..., b, K] (float32) of softmax(logits / temperature) from this shard's logits.

    The stable form of `core.entropy`: H = m + log S - U / S with U = sum_v exp(z_v - m) z_v."""
    lead, parts = _chunks(logits, chunk)
    out = []
    for z_raw in parts:
        z = z_raw.float() / temperature
        m = reduce.max(z.max(dim=-1).values).detach()
        e = torch.exp(z - m.unsqueeze(-1))
        z_safe = torch.where(e > 0, z, torch.zeros((), device=z.device))  # -inf logits add 0, not NaN
        s = reduce.sum(e.sum(dim=-1))
        out.append(m + torch.log(s) - reduce.sum((e * z_safe).sum(dim=-1)) / s)
    return torch.cat(out, dim=-1).reshape(lead)
