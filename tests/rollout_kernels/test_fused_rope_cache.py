"""The RoPE + KV-cache write kernel equals its torch path, under Triton's interpreter (see conftest.py)."""

from __future__ import annotations

import pytest
import torch
from kernel_tolerances import assert_kernel_close

from quartet.rollout.torch.graph_decode import row_buckets
from quartet.rollout.torch.kernels.rope_cache import rope_cache_torch, rope_cache_triton, signed_sin

CAPACITY = 16


def _case(
    rows: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0
) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """Inputs as the runner has them (q, k, v transposed views of the projections), lengths, and caches of
    rows + 2 slots whose every entry holds a distinct value (so a stray or missing write shows)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, 1, heads, head_dim, generator=gen).to(dtype).transpose(1, 2)
    k, v = (torch.randn(rows, 1, kv_heads, head_dim, generator=gen).to(dtype).transpose(1, 2) for _ in "kv")
    angles = torch.randn(rows, 1, 1, head_dim // 2, generator=gen) * 3
    cos = torch.cat((angles, angles), -1).cos().to(dtype)
    sin = signed_sin(torch.cat((angles, angles), -1).sin().to(dtype))
    lengths = torch.randint(0, CAPACITY, (rows,), generator=gen)
    slots = rows + 2
    k_cache = torch.randn(slots, kv_heads, head_dim, CAPACITY, generator=gen).to(dtype)
    v_cache = torch.randn(slots, kv_heads, CAPACITY, head_dim, generator=gen).to(dtype)
    return [q, k, v, cos, sin], lengths, [k_cache, v_cache]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("rows", sorted({1, 3, *row_buckets(8)}))
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (2, 2)])
def test_the_kernel_equals_the_torch_path(
    rows: int, head_dim: int, dtype: torch.dtype, heads: int, kv_heads: int
) -> None:
    inputs, lengths, caches = _case(rows, heads, kv_heads, head_dim, dtype)
    ours = [c.clone() for c in caches]
    theirs = [c.clone() for c in caches]
    q_rot = rope_cache_triton(*inputs, *ours, lengths)
    want_q = rope_cache_torch(*inputs, *theirs, lengths)
    # x * cos rounded, then the fused multiply-add rounded: two roundings, of terms up to max |x| (|cos|,
    # |sin| <= 1)
    assert_kernel_close(q_rot, want_q, roundings=2, terms=float(inputs[0].abs().max()))
    assert_kernel_close(ours[0], theirs[0], roundings=2, terms=float(inputs[1].abs().max()))
    assert torch.equal(ours[1], theirs[1])  # values are copied, not computed
    untouched = torch.ones_like(caches[1], dtype=torch.bool)
    untouched[torch.arange(rows), :, lengths] = False
    assert torch.equal(ours[1][untouched], caches[1][untouched])  # nothing but the new columns written


def test_the_interpreter_runs_the_kernel_on_its_inputs() -> None:
    """Other lengths write other columns: the kernel reads `lengths` (and really ran)."""
    inputs, lengths, caches = _case(3, 4, 2, 64, torch.float32, seed=1)
    shifted = (lengths + 1) % CAPACITY
    ours = [c.clone() for c in caches]
    theirs = [c.clone() for c in caches]
    rope_cache_triton(*inputs, *ours, shifted)
    rope_cache_torch(*inputs, *theirs, lengths)
    assert not torch.equal(ours[1], theirs[1])
    rope_cache_torch(*inputs, *theirs, shifted)  # the same columns written twice now hold the new values
    assert torch.equal(ours[1][torch.arange(3), :, shifted], theirs[1][torch.arange(3), :, shifted])


def test_bad_shapes_and_strides_are_refused_naming_them() -> None:
    inputs, lengths, caches = _case(2, 4, 2, 64, torch.float32)
    q, k, v, cos, sin = inputs
    with pytest.raises(ValueError, match="even hd"):
        rope_cache_triton(q[..., :63], k[..., :63], v[..., :63], cos, sin, *caches, lengths)
    with pytest.raises(ValueError, match=r"\['k_cache'\]"):
        rope_cache_triton(q, k, v, cos, sin, caches[0].transpose(2, 3), caches[1], lengths)
