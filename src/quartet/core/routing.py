"""Mixture-of-experts routing as data: the recorded top-k expert indices and how they compare.

Routing replay (R3, docs/moe_routing_replay.md) records, for every token the rollout engine processes, the
top-k expert indices of every MoE layer, carries them with the batch as one column aligned with the input
ids, and makes the trainer route every token to the same experts. This module holds what every layer above
shares: the column's name and layout, its dtype, and the comparison behind `moe/routing_mismatch`.

    routed_experts [B, P + R, L, k]   uint8 for E <= 256 experts, else int16
    (prompt columns left-padded like `prompts`, response columns right-padded like `responses`;
     0 on padding and on each row's last token, which the engine never fed back)
"""

from __future__ import annotations

import torch

__all__ = [
    "ROUTED_EXPERTS",
    "ROUTING_MISMATCH",
    "fed_response_mask",
    "mismatch_share",
    "routing_bytes_per_token",
    "routing_dtype",
    "routing_mismatch",
]

ROUTED_EXPERTS = "routed_experts"
"""The batch column of recorded expert indices [B, P + R, L, k] (the layout in the module docstring)."""

ROUTING_MISMATCH = "routing_mismatch"
"""The batch column [B, R] float32: per response token, the share of MoE layers whose top-k set the trainer
chose differently from the engine (0 where nothing was recorded)."""


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest integer dtype that holds the expert indices 0 .. num_experts - 1."""
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if num_experts <= 256:
        return torch.uint8
    if num_experts <= 2**15:
        return torch.int16
    return torch.int32


def routing_bytes_per_token(num_layers: int, top_k: int, num_experts: int) -> int:
    """Bytes the recorded routing of one token takes in the batch: layers x k x the index's size."""
    return num_layers * top_k * torch.empty(0, dtype=routing_dtype(num_experts)).element_size()


def routing_mismatch(own: torch.Tensor, recorded: torch.Tensor) -> torch.Tensor:
    """[..., L] bool: True where the top-k SET of `own` [..., L, k] differs from that of `recorded`.

    The order inside a top-k does not matter (the engine and the trainer may sort ties differently); a
    different expert anywhere in the set does.
    """
    if own.shape != recorded.shape:
        raise ValueError(f"routing shapes differ: {tuple(own.shape)} vs {tuple(recorded.shape)}")
    mine = own.to(torch.int64).sort(dim=-1).values
    theirs = recorded.to(torch.int64).sort(dim=-1).values
    return (mine != theirs).any(dim=-1)


def fed_response_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """[B, R] bool: the response tokens the engine fed back through the model (and so recorded), i.e. every
    response token that has a next one; the last token of a response is sampled, never fed."""
    mask = response_mask != 0
    return mask & torch.nn.functional.pad(mask[:, 1:], (0, 1), value=False)


def mismatch_share(per_token: torch.Tensor, response_mask: torch.Tensor) -> float:
    """`moe/routing_mismatch`: the share of (response token, MoE layer) pairs routed differently by the
    trainer than by the engine, over the fed response tokens, from the [B, R] per-token shares
    (`ROUTING_MISMATCH`); 0 when no token was fed."""
    fed = fed_response_mask(response_mask)
    count = int(fed.sum())
    return float(per_token.double()[fed].sum() / count) if count else 0.0
