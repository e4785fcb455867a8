"""The fp8 weight format of `rollout.quantization=fp8` (`quartet.rollout.torch.fp8`) against independent
computations: the per-channel scale, the rounding (checked against e4m3's whole table of values), the error
bound of the format, zero rows, and rows it must refuse."""

from __future__ import annotations

import pytest
import torch

from quartet.rollout.torch.fp8 import (
    FP8_DTYPE,
    Fp8QuantizationError,
    dequantize_rows,
    quantize_rows,
    quantize_tokens,
)


def _weight(rows: int = 48, cols: int = 80, seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes (1e-4 .. 1e2) with an outlier each: a real per-row scale test."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen) * torch.logspace(-4, 2, rows).unsqueeze(1)
    w[torch.arange(rows), torch.randint(cols, (rows,), generator=gen)] *= 8.0
    return w


def _e4m3_values() -> torch.Tensor:
    """Every finite float8 e4m3fn value, ascending, from its 256 bit patterns (nan excluded)."""
    values = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).to(torch.float64)
    return torch.unique(values[torch.isfinite(values)])


def test_quantize_matches_the_row_by_row_definition() -> None:
    w = _weight()
    q, scale = quantize_rows(w.to(torch.bfloat16))
    assert q.dtype == FP8_DTYPE and scale.dtype == torch.float32
    assert q.shape == w.shape and scale.shape == (w.shape[0],)
    wb = w.to(torch.bfloat16).to(torch.float32)  # what the module saw
    for r in range(w.shape[0]):
        row = wb[r]
        expected_scale = row.abs().max() / 448.0
        assert scale[r].item() == expected_scale.item()
        expected = torch.clamp(row / expected_scale, -448.0, 448.0).to(FP8_DTYPE)
        assert torch.equal(q[r].view(torch.uint8), expected.view(torch.uint8)), f"row {r}"
    assert torch.equal(q.to(torch.float32).abs().amax(dim=1), torch.full((w.shape[0],), 448.0))


def test_rounding_is_to_a_nearest_e4m3_value() -> None:
    w = _weight(seed=1)
    q, scale = quantize_rows(w)
    grid = _e4m3_values()
    x = (w / scale.unsqueeze(1)).to(torch.float64).flatten()
    got = q.to(torch.float64).flatten()
    nearest = (x.unsqueeze(1) - grid.unsqueeze(0)).abs().min(dim=1).values
    assert torch.equal((x - got).abs(), nearest)  # no e4m3 value is closer than the chosen one


def test_error_is_within_the_format_bound() -> None:
    """|deq - w| <= 2^-4 |w| where w / scale is normal in e4m3 (>= 2^-6), <= 2^-10 scale below it."""
    w = _weight(seed=2)
    q, scale = quantize_rows(w)
    deq = dequantize_rows(q, scale, torch.float64)
    w64, s64 = w.to(torch.float64), scale.to(torch.float64).unsqueeze(1)
    err = (deq - w64).abs()
    normal = w64.abs() / s64 >= 2.0**-6
    assert bool(normal.any()) and bool((~normal).any())  # both regimes are exercised
    rel = err[normal] / w64.abs()[normal]
    assert float(rel.max()) <= 2.0**-4
    assert float(rel.max()) > 2.0**-5  # the bound is nearly reached: the check is not vacuous
    assert bool((err[~normal] <= 2.0**-10 * s64.expand_as(w64)[~normal]).all())
    assert float(rel.mean()) < 2.0**-5  # typical elements sit inside the worst case (about 2^-5.5)


def test_dequantize_computes_in_float32_then_casts() -> None:
    q, scale = quantize_rows(_weight(seed=3))
    expected = (q.to(torch.float64) * scale.to(torch.float64).unsqueeze(1)).to(torch.float32)
    assert torch.equal(dequantize_rows(q, scale, torch.float32), expected)  # q x scale is exact in fp32
    assert torch.equal(dequantize_rows(q, scale, torch.bfloat16), expected.to(torch.bfloat16))


def test_zero_rows_stay_zero() -> None:
    w = _weight(rows=6, cols=16, seed=4)
    w[2] = 0.0
    w[5] = -0.0
    q, scale = quantize_rows(w)
    assert scale[2].item() == 1.0 and scale[5].item() == 1.0
    deq = dequantize_rows(q, scale, torch.float32)
    assert torch.equal(deq[2], torch.zeros(16)) and torch.equal(deq[5].abs(), torch.zeros(16))
    assert bool(torch.isfinite(deq).all())


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_rows_with_inf_or_nan_are_refused_by_name(bad: float) -> None:
    w = _weight(rows=8, cols=16, seed=5)
    w[3, 7] = bad
    w[6, 0] = bad
    message = r"'layers.0.mlp.up_proj.weight'.*2 of its 8 rows.*\[3, 6\]"
    with pytest.raises(Fp8QuantizationError, match=message):
        quantize_rows(w, "layers.0.mlp.up_proj.weight")


def test_a_weight_that_is_not_a_matrix_is_refused() -> None:
    with pytest.raises(Fp8QuantizationError, match="'norm.weight' has shape \\(16,\\)"):
        quantize_rows(torch.ones(16), "norm.weight")


def test_activation_scales_are_per_token() -> None:
    x = _weight(rows=5, cols=32, seed=6)
    x[1] = 0.0
    xq, xs = quantize_tokens(x)
    assert xs.shape == (5, 1)
    for r in (0, 2, 3, 4):
        assert xs[r, 0].item() == (x[r].abs().max() / 448.0).item()
    assert torch.equal(xq[1].to(torch.float32), torch.zeros(32))  # a zero token stays zero, no nan
    err = (xq.to(torch.float64) * xs.to(torch.float64) - x.to(torch.float64)).abs()
    big = x.abs() / xs >= 2.0**-6
    assert float((err[big] / x.to(torch.float64).abs()[big]).max()) <= 2.0**-4
