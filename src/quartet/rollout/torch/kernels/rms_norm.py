"""Fused residual add + RMSNorm of the decode step: `normed = weight * rms_norm(x + residual)`.

A Llama/Qwen2 decoder layer adds each block's output to the residual stream and normalises the sum for
the next block: on a GPU that is an add, RMSNorm's kernels and a multiply per norm, twice a layer. The
Triton kernel does it in one pass per row and also returns the new residual (the rounded sum), which the
next add reads. It rounds where the torch path rounds (the sum to the tensor's dtype, the normalised value
before the weight), so it differs from the torch path only by the order of the mean's summation.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["add_rms_norm_torch", "add_rms_norm_triton"]


def add_rms_norm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch path: (weight * rms_norm(x + residual), x + residual), each [..., D] in x's dtype.

    Exactly what the runner computed before the kernels existed (`model_runner._norm` after the add).
    """
    total = x + residual
    normed = weight * F.rms_norm(total, (total.shape[-1],), eps=eps)
    return normed, total


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, imported on first use (Triton is optional; `TRITON_INTERPRET` is read then)."""
    from quartet.rollout.torch.kernels.rms_norm_triton import add_rms_norm_kernel

    return add_rms_norm_kernel


def add_rms_norm_triton(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`add_rms_norm_torch` as one Triton kernel (one program per row of D <= 65536 features)."""
    hidden = x.shape[-1]
    if residual.shape != x.shape or weight.shape != (hidden,):
        raise ValueError(
            f"add_rms_norm: x {tuple(x.shape)}, residual {tuple(residual.shape)}, weight "
            f"{tuple(weight.shape)}; want equal x/residual shapes and weight [{hidden}]"
        )
    x_c, res_c = x.contiguous(), residual.contiguous()
    normed = torch.empty_like(x_c)
    total = torch.empty_like(x_c)
    rows = x_c.numel() // max(hidden, 1)
    if rows:
        block = 1 << max(hidden - 1, 0).bit_length()
        warps = 8 if block >= 2048 else 4  # a 7B row (3584 features): 16 per thread
        _kernel()[(rows,)](
            x_c, res_c, weight.contiguous(), normed, total, hidden, eps, BLOCK=block, num_warps=warps
        )
    return normed, total
