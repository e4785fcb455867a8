"""Expert parallelism of mixture-of-experts layers (`model.expert_parallel_size`, ep).

An expert group is ep consecutive ranks ("ep" of the ("edp", "ep") mesh, see `dist`). Each rank of it holds
num_experts / ep experts of every sparse MoE block: rank r the slice [r * E/ep, (r + 1) * E/ep) of the fused
`gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] weights, as a DTensor `Shard(0)` over "ep", so that
`full_tensor()` (weight sync, HF export) and torch.distributed.checkpoint see the whole [E, ...] tensors.
FSDP2 then shards those slices over "edp" (the ranks holding the same experts) and everything else over
all ranks (`fsdp.shard`).

Every rank keeps its own rows (and, under sequence parallelism, its own tokens): the attention, the norms
and the router run locally as without ep. In a sparse block (`ParallelExperts.forward`, in place of
transformers' experts module; the block's own forward is unchanged):

    1. the router's (token, k) pairs are sorted by expert, hence by the rank that holds it (expert // E/ep);
    2. the per-expert counts are exchanged (one small all-to-all), so each rank knows what it receives;
    3. the hidden states of the pairs travel by an autograd-aware all-to-all to their experts' ranks;
    4. each local expert runs on the rows it received (grouped by expert);
    5. a second all-to-all sends the results back (its backward is the reverse all-to-all);
    6. the pairs are put back in token order and combined with the router's top-k weights, through which
       the router gets its gradient.

Gradient scale. The engine multiplies each rank's loss by the world size and FSDP2 averages gradients over
the ranks that shard a parameter. A dense parameter thus gets the sum over all ranks of their losses'
gradients. An expert's local gradient already sums the contributions of the tokens of all ep ranks of its
group (the backward all-to-all brought them), and FSDP averages it over "edp" only (world / ep ranks): it
comes out ep times too large. `scale_grad` divides the local expert weights' gradient by ep where they are
used (exact for powers of two), so one optimizer step equals one process's on the concatenated rows.

transformers' `@use_experts_implementation` only dispatches the experts' forward to an implementation
named in the config (eager loop, grouped or batched matmul), all over the full [E, ...] weights; the module
is replaced here, not patched, so none of them runs under ep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

__all__ = [
    "ExpertGroup",
    "ParallelExperts",
    "all_to_all",
    "combine",
    "expert_slice",
    "parallelize_experts",
    "scale_grad",
]


@dataclass(frozen=True)
class ExpertGroup:
    """This rank's expert group: its size (ep), this rank's place in it, and its process group."""

    size: int
    rank: int
    group: Any


def expert_slice(num_experts: int, size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the experts that rank `rank` of an expert group of `size` ranks holds."""
    local = num_experts // size
    return rank * local, (rank + 1) * local


class _AllToAll(torch.autograd.Function):
    """All-to-all of rows: chunk i of `send` sizes goes to rank i; the backward sends the gradients back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
        ctx.send = send
        ctx.recv = recv
        ctx.group = group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        back = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    """Rows of `x` in chunks of `send` sizes to the ranks of `group`, in rank order; receives `recv` sizes.

    Differentiable: the gradient of the result travels back by the reverse all-to-all."""
    out: torch.Tensor = _AllToAll.apply(x, send, recv, group)  # type: ignore[no-untyped-call]
    return out


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def scale_grad(x: torch.Tensor, factor: float) -> torch.Tensor:
    """`x` unchanged, with its gradient multiplied by `factor` (the ep correction, see the module doc)."""
    out: torch.Tensor = _ScaleGrad.apply(x, factor)  # type: ignore[no-untyped-call]
    return out


def combine(pairs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The block's output [T, H] from the expert outputs of its (token, k) pairs [T, K, H] and the router's
    top-k weights [T, K]: the weighted sum over k (the router's gradient flows through `weights`)."""
    return (pairs * weights.unsqueeze(-1)).sum(dim=1)  # bfloat16 outputs x float32 weights: float32


def _inverse(order: torch.Tensor) -> torch.Tensor:
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    return inv


class ParallelExperts(nn.Module):
    """This rank's experts of one sparse MoE block, and the all-to-all dispatch to the others' experts.

    Takes the place of transformers' experts module (same parameter names, same call): `gate_up_proj`
    [E, 2I, H] and `down_proj` [E, H, I] are DTensors sharded by expert over the 1-D "ep" `mesh`.
    """

    def __init__(self, experts: nn.Module, group: ExpertGroup, mesh: DeviceMesh) -> None:
        super().__init__()
        gate_up, down = experts.gate_up_proj, experts.down_proj
        assert isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)
        self.num_experts = int(gate_up.shape[0])
        self.group = group
        start, stop = expert_slice(self.num_experts, group.size, group.rank)
        self.num_local = stop - start
        self.act_fn = experts.get_submodule("act_fn")
        self.gate_up_proj = self._local(gate_up, start, stop, mesh)
        self.down_proj = self._local(down, start, stop, mesh)

    @staticmethod
    def _local(param: nn.Parameter, start: int, stop: int, mesh: DeviceMesh) -> nn.Parameter:
        local = param.detach()[start:stop].clone()
        shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
        return nn.Parameter(shard, requires_grad=param.requires_grad)

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        """The block's output [T, H] for `hidden_states` [T, H] routed to `top_k_index` [T, K] with
        `top_k_weights` [T, K] (a collective: every rank of the expert group calls it)."""
        tokens, k = top_k_index.shape
        size, group = self.group.size, self.group.group
        flat = top_k_index.reshape(-1)
        order = torch.argsort(flat, stable=True)  # pairs by expert, hence by destination rank
        counts = torch.bincount(flat, minlength=self.num_experts)
        received = torch.empty_like(counts)  # [source rank x local expert]: rows this rank receives
        dist.all_to_all_single(received, counts, group=group)
        send = counts.view(size, self.num_local).sum(dim=1).tolist()
        recv = received.view(size, self.num_local).sum(dim=1).tolist()
        rows = all_to_all(hidden_states[order // k], send, recv, group)
        local_ids = torch.arange(self.num_local, device=flat.device).repeat(size)
        outputs = self._run_local(rows, torch.repeat_interleave(local_ids, received))
        back = all_to_all(outputs, recv, send, group)  # in `order`'s order
        pairs = back[_inverse(order)].view(tokens, k, hidden_states.shape[-1])
        return combine(pairs, top_k_weights).to(hidden_states.dtype)

    def _run_local(self, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
        """Each received row through its local expert (rows grouped by expert, then put back)."""
        gate_up = scale_grad(_local_tensor(self.gate_up_proj), 1.0 / self.group.size)
        down = scale_grad(_local_tensor(self.down_proj), 1.0 / self.group.size)
        order = torch.argsort(expert_of_row, stable=True)
        sizes = torch.bincount(expert_of_row, minlength=self.num_local).tolist()
        pieces = []
        # every local expert runs, on zero rows too: its weights then always get a (zero) gradient, so the
        # ranks sharding them reduce the same set of gradients
        for e, chunk in enumerate(torch.split(rows[order], sizes)):
            gate, up = F.linear(chunk, gate_up[e]).chunk(2, dim=-1)
            pieces.append(F.linear(self.act_fn(gate) * up, down[e]))
        return torch.cat(pieces)[_inverse(order)]


def _local_tensor(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def _is_fused_experts(module: nn.Module) -> bool:
    """transformers' fused experts layout: gate_up_proj [E, 2I, H] (gate first), down_proj [E, H, I]."""
    gate_up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(gate_up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gate_up.dim() == 3
        and down.dim() == 3
        and getattr(module, "is_concatenated", True)
        and not getattr(module, "is_transposed", False)
        and not getattr(module, "has_bias", False)
        and getattr(module, "has_gate", True)
    )


def _sparse_blocks(module: nn.Module) -> list[nn.Module]:
    """The sparse MoE blocks of `module`: a router (`gate`) and an `experts` module in the fused layout."""
    return [m for m in module.modules() if _has_module(m, "experts") and _has_module(m, "gate")]


def _has_module(module: nn.Module, name: str) -> bool:
    return isinstance(getattr(module, name, None), nn.Module)


def parallelize_experts(module: nn.Module, mesh: DeviceMesh) -> int:
    """Replace the experts of every sparse MoE block of `module` by this rank's `ParallelExperts` over the
    1-D "ep" `mesh` (in place); returns how many blocks were split.

    The model's experts per layer are divisible by ep: the build checked it (`model_check`)."""
    group = ExpertGroup(size=mesh.size(), rank=mesh.get_local_rank(), group=mesh.get_group())
    blocks = _sparse_blocks(module)
    for block in blocks:
        experts = block.get_submodule("experts")
        if not _is_fused_experts(experts):
            raise ValueError(
                f"model.expert_parallel_size={group.size}: {type(experts).__name__} does not hold its "
                "experts as fused gate_up_proj [E, 2I, H] / down_proj [E, H, I] weights; set "
                "model.expert_parallel_size: 1"
            )
        block.experts = ParallelExperts(experts, group, mesh)
    if not blocks:
        raise ValueError(
            f"model.expert_parallel_size={group.size}: the model has no mixture-of-experts blocks to split; "
            "set model.expert_parallel_size: 1"
        )
    return len(blocks)
