"""The tolerances of the kernel tests, with the reason for each (imported by the test modules)."""

from __future__ import annotations

import torch

BF16_ULP = 2.0**-7
"""bfloat16 keeps 8 significant bits: one unit in the last place is 2**-7 of the value (at most)."""


def assert_kernel_close(
    got: torch.Tensor, want: torch.Tensor, roundings: int = 2, terms: float = 0.0
) -> None:
    """Assert a kernel's output equals its torch path's up to the rounding either may do differently.

    float32: the kernels compute in float32 as torch does; only a reduction's summation order differs, so
    1e-5 relative (a few units of float32's 2**-24 over sums of up to a few hundred terms).
    bfloat16: Triton's interpreter rounds float32 to bfloat16 by truncation where torch (and Triton on a
    GPU) rounds to nearest even, so each rounding may differ by one unit in the last place: `roundings`
    chained roundings give `roundings` units, relative to the value (an absolute floor of 1e-6 for zeros).
    Where terms of magnitude up to `terms` cancel (RoPE's x * cos + rotate_half(x) * sin), a rounding of a
    term is relative to the term, not to the result: `roundings` units of `terms` absolute.
    """
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:
        rel = roundings * BF16_ULP
        torch.testing.assert_close(got.float(), want.float(), rtol=rel, atol=max(1e-6, rel * terms))
