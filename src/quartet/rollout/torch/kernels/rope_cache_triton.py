"""The RoPE + KV-cache write kernel's Triton code (imported by `rope_cache` on first use: it needs Triton).

Grid (rows, query heads + key/value heads): a program rotates one query head, or rotates one key head and
stores it with its value head at the row's cache column.
"""

# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["rope_cache_kernel"]


@triton.jit
def rope_cache_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, out_ptr, kc_ptr, vc_ptr, len_ptr,
    num_heads, q_row, q_head, k_row, k_head, v_row, v_head, cos_row, sin_row,
    kc_slot, kc_head, kc_dim, vc_slot, vc_head, vc_col,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK)
    mask = d < HEAD_DIM
    partner = (d + HEAD_DIM // 2) % HEAD_DIM
    c = tl.load(cos_ptr + row * cos_row + d, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + row * sin_row + d, mask=mask, other=0.0).to(tl.float32)
    if head < num_heads:
        src = q_ptr + row * q_row + head * q_head
        x = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(src + partner, mask=mask, other=0.0).to(tl.float32)
        first = (x * c).to(out_ptr.dtype.element_ty).to(tl.float32)
        dst = out_ptr + (row * num_heads + head) * HEAD_DIM + d
        tl.store(dst, (first + p * s).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        kv = head - num_heads
        col = tl.load(len_ptr + row)
        src = k_ptr + row * k_row + kv * k_head
        x = tl.load(src + d, mask=mask, other=0.0).to(tl.float32)
        p = tl.load(src + partner, mask=mask, other=0.0).to(tl.float32)
        first = (x * c).to(kc_ptr.dtype.element_ty).to(tl.float32)
        k_dst = kc_ptr + row * kc_slot + kv * kc_head + d * kc_dim + col
        tl.store(k_dst, (first + p * s).to(kc_ptr.dtype.element_ty), mask=mask)
        val = tl.load(v_ptr + row * v_row + kv * v_head + d, mask=mask, other=0.0)
        v_dst = vc_ptr + row * vc_slot + kv * vc_head + col * vc_col + d
        tl.store(v_dst, val.to(vc_ptr.dtype.element_ty), mask=mask)
