"""The residual add + RMSNorm kernel's Triton code (imported by `rms_norm` on first use: it needs Triton).

One program per row of `hidden` features (BLOCK: the next power of two).
"""

# mypy: disable-error-code="no-untyped-def,untyped-decorator"
# ruff: noqa: N803 - Triton's constexpr parameters are upper case by convention

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["add_rms_norm_kernel"]


@triton.jit
def add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, hidden, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    offs = row * hidden + cols
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    total = (x + r).to(sum_ptr.dtype.element_ty)
    tl.store(sum_ptr + offs, total, mask=mask)
    t32 = total.to(tl.float32)
    mean_sq = tl.sum(t32 * t32, axis=0) / hidden
    normed = (t32 * tl.rsqrt(mean_sq + eps)).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)
