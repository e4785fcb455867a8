"""The residual add + RMSNorm kernel equals its torch path, under Triton's interpreter (see conftest.py)."""

from __future__ import annotations

import pytest
import torch
from kernel_tolerances import assert_kernel_close

from quartet.rollout.torch.kernels import rms_norm
from quartet.rollout.torch.kernels.rms_norm import add_rms_norm_torch, add_rms_norm_triton


def _inputs(rows: int, hidden: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen).to(dtype) for shape in ((rows, 1, hidden),) * 2 + ((hidden,),)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden", [1, 3, 127])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_the_kernel_equals_the_torch_path(rows: int, hidden: int, dtype: torch.dtype) -> None:
    x, residual, weight = _inputs(rows, hidden, dtype)
    normed, total = add_rms_norm_triton(x, residual, weight, 1e-6)
    want_normed, want_total = add_rms_norm_torch(x, residual, weight, 1e-6)
    assert_kernel_close(total, want_total, roundings=1)  # one rounding: the sum's
    # the sum's rounding carried through the normalisation, then the normalised value's and the product's
    assert_kernel_close(normed, want_normed, roundings=4)


def test_the_torch_path_is_the_runners_norm_after_the_add() -> None:
    """Independent check of the reference: weight * x / sqrt(mean(x^2) + eps) in float64."""
    x, residual, weight = _inputs(3, 127, torch.float32, seed=1)
    normed, total = add_rms_norm_torch(x, residual, weight, 1e-5)
    s = x.double() + residual.double()
    want = weight.double() * s / torch.sqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(total.double(), s, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(normed.double(), want, rtol=1e-5, atol=1e-5)


def test_the_interpreter_runs_the_kernel_on_its_inputs() -> None:
    """The kernel really runs (interpreted) and reads its inputs: a doubled weight doubles the output."""
    x, residual, weight = _inputs(3, 127, torch.float32, seed=2)
    assert type(rms_norm._kernel()).__name__ == "InterpretedFunction"
    normed, _ = add_rms_norm_triton(x, residual, 2 * weight, 1e-6)
    want, _ = add_rms_norm_torch(x, residual, weight, 1e-6)
    assert not torch.allclose(normed, want)
    torch.testing.assert_close(normed, 2 * want, rtol=1e-5, atol=1e-6)


def test_mismatched_shapes_are_refused_naming_them() -> None:
    x, residual, weight = _inputs(3, 8, torch.float32)
    with pytest.raises(ValueError, match=r"weight \(7,\)"):
        add_rms_norm_triton(x, residual, weight[:7], 1e-6)
    with pytest.raises(ValueError, match=r"residual \(2, 1, 8\)"):
        add_rms_norm_triton(x, residual[:2], weight, 1e-6)
