"""RoPE on the decode step's queries and keys, with the keys and values written into the slot KV cache.

The torch path rotates q and k (a roll, a product and a fused multiply-add each) and then writes k and v
into the cache with two indexed assignments: eight or so kernels per layer and step. The Triton kernel
does all of it in one launch: one program per (row, head) rotates that head's query, or rotates that key
head and stores it with its value head at the row's column (`SlotKVCache`: keys [slots, kvH, hd, cap],
values [slots, kvH, cap, hd]; row i lives in slot i, its new token at column `lengths[i]`).
It rounds where the torch path rounds (x * cos to the dtype, then the fused multiply-add).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__ = ["apply_rope", "rope_cache_torch", "rope_cache_triton", "signed_sin"]


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """cat(-sin1, sin2) of the last dimension (the sign `rotate_half` gives), made once per forward."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [..., hd] (transformers' convention: x * cos + rotate_half(x) * sin).

    rotate_half(x) * sin = cat(-x2, x1) * sin = roll(x, hd/2) * cat(-sin1, sin2): three kernels per
    tensor (a roll, a product, a fused multiply-add) instead of five.
    """
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


def rope_cache_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """The torch path: rotate q [A, H, 1, hd] and k [A, kvH, 1, hd], store k and v [A, kvH, 1, hd] in slots
    0..A-1 at columns `lengths` [A] of one layer's caches, return the rotated q [A, H, 1, hd].

    cos, sin_signed [A, 1, 1, hd] (`signed_sin`). What the runner did before the kernels existed.
    """
    rows = torch.arange(q.shape[0], device=q.device)
    k_rot = apply_rope(k, cos, sin_signed)
    k_cache[rows, :, :, lengths] = k_rot[:, :, 0]
    v_cache[rows, :, lengths] = v[:, :, 0]
    return apply_rope(q, cos, sin_signed)


@functools.cache
def _kernel() -> Any:
    """The Triton kernel, imported on first use (Triton is optional; `TRITON_INTERPRET` is read then)."""
    from quartet.rollout.torch.kernels.rope_cache_triton import rope_cache_kernel

    return rope_cache_kernel


def rope_cache_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin_signed: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    lengths: torch.Tensor,
) -> torch.Tensor:
    """`rope_cache_torch` as one Triton launch over (rows, query heads + key/value heads).

    Any strides on the row and head dimensions; the head dimension itself must be contiguous, as must the
    caches' last dimension (the `SlotKVCache` layout).
    """
    rows, heads, _, head_dim = q.shape
    kv_heads = k.shape[1]
    if head_dim % 2 or k.shape != v.shape or k.shape[0] != rows or k.shape[3] != head_dim:
        raise ValueError(
            f"rope_cache: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; want q [A, H, 1, hd], "
            "k and v [A, kvH, 1, hd] with an even hd"
        )
    tensors = {"q": q, "k": k, "v": v, "cos": cos, "sin_signed": sin_signed}
    strided = [name for name, t in tensors.items() if t.stride(-1) != 1]
    strided += [name for name, t in (("k_cache", k_cache), ("v_cache", v_cache)) if t.stride(-1) != 1]
    if strided:
        raise ValueError(f"rope_cache: the last dimension of {strided} must be contiguous")
    out = torch.empty((rows, heads, 1, head_dim), dtype=q.dtype, device=q.device)
    cos2 = cos.reshape(rows, head_dim)
    sin2 = sin_signed.reshape(rows, head_dim)
    _kernel()[(rows, heads + kv_heads)](
        q, k, v, cos2, sin2, out, k_cache, v_cache, lengths,
        heads, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        cos2.stride(0), sin2.stride(0),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, BLOCK=1 << (head_dim - 1).bit_length(),
    )  # fmt: skip
    return out
