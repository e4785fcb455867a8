"""Entropy from logits (chunked, stable) against a loop reference, and the entropy bonus."""

from __future__ import annotations

import pytest
import reference_algos as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.choices import LossAggMode
from quartet.core.entropy import entropy_bonus, entropy_from_logits
from quartet.core.metrics import ENTROPY


@settings(max_examples=60, deadline=None)
@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 5),
    vocab=st.integers(1, 40),
    scale=st.sampled_from([0.1, 1.0, 30.0, 1000.0]),
    chunk=st.integers(1, 8),
    vocab_chunk=st.one_of(st.none(), st.integers(1, 16)),
    seed=st.integers(0, 2**31 - 1),
)
def test_entropy_matches_loop_reference(
    batch: int, length: int, vocab: int, scale: float, chunk: int, vocab_chunk: int | None, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(batch, length, vocab, generator=g, dtype=torch.float64)
    if vocab > 2:
        logits[..., 1] = float("-inf")  # a banned token
    out = entropy_from_logits(logits, chunk_size=chunk, vocab_chunk_size=vocab_chunk)
    expected = [[ref.entropy(logits[i, t].tolist()) for t in range(length)] for i in range(batch)]
    assert out.shape == (batch, length) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref.tensor(expected), rtol=0, atol=1e-6)


@pytest.mark.parametrize(("chunk", "vocab_chunk"), [(1024, None), (3, 7), (1, 1)])
def test_gradient_matches_torch_categorical(chunk: int, vocab_chunk: int | None) -> None:
    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(2, 5, 11, generator=g, dtype=torch.float64)).requires_grad_(True)
    weights = torch.randn(2, 5, generator=g, dtype=torch.float64)
    ours = entropy_from_logits(logits, chunk_size=chunk, vocab_chunk_size=vocab_chunk)
    (grad,) = torch.autograd.grad((ours * weights).sum(), logits)
    theirs = torch.distributions.Categorical(logits=logits).entropy()
    (expected,) = torch.autograd.grad((theirs * weights).sum(), logits)
    torch.testing.assert_close(ours, theirs.detach(), rtol=0, atol=1e-10)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-10)


def test_banned_tokens_give_finite_value_and_gradient() -> None:
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]], requires_grad=True)
    out = entropy_from_logits(logits, vocab_chunk_size=2)
    assert float(out.detach()) == pytest.approx(torch.log(torch.tensor(2.0)).item())
    (grad,) = torch.autograd.grad(out.sum(), logits)
    assert torch.isfinite(grad).all()
    all_banned = entropy_from_logits(torch.full((1, 3), float("-inf")))
    assert float(all_banned) == 0.0


def test_half_precision_logits_are_upcast() -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 6, 5000, generator=g, dtype=torch.float64)
    out = entropy_from_logits(logits.to(torch.bfloat16), chunk_size=5)
    assert out.dtype == torch.float32
    expected = entropy_from_logits(logits.to(torch.bfloat16).double())
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-4)


def test_chunking_bounds_the_float32_temporaries() -> None:
    # Forward without grad on a [64 x 4096] bf16 input: with 8-token chunks and 512-entry blocks the biggest
    # float32 tensor the function creates is 8 x 512, never the whole 64 x 4096 (checked via a dispatch mode).
    from torch.utils._python_dispatch import TorchDispatchMode

    largest = 0

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            nonlocal largest
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.dtype == torch.float32:
                largest = max(largest, out.numel())
            return out

    logits = torch.randn(64, 4096).to(torch.bfloat16)
    with torch.no_grad(), Watch():
        entropy_from_logits(logits, chunk_size=8, vocab_chunk_size=512)
    assert 0 < largest <= 8 * 512 + 64


def test_empty_and_bad_arguments() -> None:
    assert entropy_from_logits(torch.zeros(0, 7)).shape == (0,)
    with pytest.raises(ValueError):
        entropy_from_logits(torch.zeros(2, 3), chunk_size=0)


def test_entropy_bonus_sign_and_metric() -> None:
    # entropies 1, 2, (masked 9), 3 -> token-mean 2; the loss term is -coef * 2 (minimising it raises H)
    ent = torch.tensor([[1.0, 2.0], [9.0, 3.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [0, 1]])
    out = entropy_bonus(ent, mask, coef=0.01)
    assert float(out.loss.detach()) == pytest.approx(-0.02)
    assert float(out.metrics[ENTROPY]) == pytest.approx(2.0)
    out.loss.backward()
    assert ent.grad is not None
    torch.testing.assert_close(ent.grad, torch.tensor([[-0.01 / 3, -0.01 / 3], [0.0, -0.01 / 3]]))
    seq = entropy_bonus(ent, mask, coef=1.0, agg_mode=LossAggMode.SEQ_MEAN_TOKEN_MEAN)
    assert float(seq.metrics[ENTROPY]) == pytest.approx((1.5 + 3.0) / 2)
