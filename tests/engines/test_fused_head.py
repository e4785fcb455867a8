"""The fused log-prob/entropy head against the plain one (`heads` on materialized logits): equal values and
gradients (float32, 1e-5), -inf logits, a bias, skipped entropy, and no [N, V] tensor ever allocated."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaConfig, LlamaForCausalLM

from quartet.engines import heads
from quartet.engines.fused_head import fused_logprobs_entropy, unsupported_reason

# (tokens N, hidden H, vocab V, token chunk, vocab block, temperature, bias): N and V not multiples of
# the chunk and block, one chunk / one block, blocks of 1 entry
SHAPES = [
    (37, 16, 101, 16, 32, 0.7, False),
    (64, 8, 50, 64, 50, 1.0, True),
    (5, 4, 7, 2, 1, 1.3, True),
    (130, 12, 257, 1000, 64, 2.0, False),
]


def _case(n: int, h: int, v: int, bias: bool, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 1.5 / h**0.5).requires_grad_()  # logits of a few units
    b = (torch.randn(v, generator=g)).requires_grad_() if bias else None
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, targets  # type: ignore[return-value]


def _plain(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor, temp: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, weight, bias).unsqueeze(0)  # [1, N, V]
    lp = heads.response_logprobs(logits, targets.unsqueeze(0), temp)[0]
    return lp, heads.response_entropy(logits, temp)[0]


def _grads(out: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(torch.autograd.grad(out, params))


@pytest.mark.parametrize(("n", "h", "v", "chunk", "block", "temp", "bias"), SHAPES)
def test_values_and_gradients_equal_the_plain_head(
    n: int, h: int, v: int, chunk: int, block: int, temp: float, bias: bool
) -> None:
    hidden, weight, b, targets = _case(n, h, v, bias)
    lp, ent = fused_logprobs_entropy(
        hidden, weight, b, targets, temp, with_entropy=True, token_chunk=chunk, vocab_block=block
    )
    want_lp, want_ent = _plain(hidden, weight, b, targets, temp)
    assert ent is not None and lp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)
    params = [hidden, weight] + ([b] if b is not None else [])
    g = torch.Generator().manual_seed(1)
    a, c = torch.randn(n, generator=g), torch.randn(n, generator=g)
    got = _grads((lp * a).sum() + (ent * c).sum(), params)
    want = _grads((want_lp * a).sum() + (want_ent * c).sum(), params)
    for name, x, y in zip(("hidden", "weight", "bias"), got, want, strict=False):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5, msg=name)


def test_banned_tokens_at_minus_inf_stay_finite() -> None:
    """Bias -inf on a third of the vocabulary (banned tokens): values and gradients finite and equal."""
    hidden, weight, _, _ = _case(23, 8, 60, False, seed=3)
    bias = torch.zeros(60)
    bias[::3] = -torch.inf
    targets = torch.randint(0, 20, (23,)) * 3 + 1  # never a banned entry
    lp, ent = fused_logprobs_entropy(
        hidden, weight, bias, targets, 0.8, with_entropy=True, token_chunk=7, vocab_block=9
    )
    want_lp, want_ent = _plain(hidden, weight, bias, targets, 0.8)
    assert ent is not None
    torch.testing.assert_close(lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, want_ent, atol=1e-5, rtol=0)
    got = _grads(lp.sum() + ent.sum(), [hidden, weight])
    want = _grads(want_lp.sum() + want_ent.sum(), [hidden, weight])
    for x, y in zip(got, want, strict=True):
        assert torch.isfinite(x).all()
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_entropy_not_asked_or_unused_gives_the_log_prob_gradient_alone() -> None:
    hidden, weight, _, targets = _case(40, 8, 90, False, seed=4)
    want = _grads(_plain(hidden, weight, None, targets, 1.0)[0].sum(), [hidden, weight])
    lp, ent = fused_logprobs_entropy(hidden, weight, None, targets, 1.0, token_chunk=16, vocab_block=20)
    assert ent is None
    for x, y in zip(_grads(lp.sum(), [hidden, weight]), want, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)
    lp, ent = fused_logprobs_entropy(hidden, weight, None, targets, 1.0, with_entropy=True, vocab_block=20)
    assert ent is not None and ent.requires_grad  # computed, but the loss does not use it
    for x, y in zip(_grads(lp.sum(), [hidden, weight]), want, strict=True):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-5)


def test_batched_shape_and_bad_input() -> None:
    hidden, weight, _, targets = _case(12, 4, 30, False)
    lp, _ = fused_logprobs_entropy(hidden.reshape(3, 4, 4), weight, None, targets.reshape(3, 4), 1.0)
    assert lp.shape == (3, 4)
    with pytest.raises(ValueError, match="temperature"):
        fused_logprobs_entropy(hidden, weight, None, targets, 0.0)
    with pytest.raises(ValueError, match="shapes"):
        fused_logprobs_entropy(hidden, weight, None, targets[:5], 1.0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in elements) any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("fused", [True, False])
def test_no_tensor_of_n_by_v_in_forward_and_backward(fused: bool) -> None:
    n, h, v = 256, 16, 4096
    hidden, weight, _, targets = _case(n, h, v, False)
    with _LargestTensor() as mode:
        if fused:
            lp, ent = fused_logprobs_entropy(
                hidden, weight, None, targets, 1.0, with_entropy=True, token_chunk=64, vocab_block=512
            )
        else:
            lp, ent = _plain(hidden, weight, None, targets, 1.0)
        assert ent is not None
        (lp.sum() + ent.sum()).backward()
    if fused:  # chunk x block temporaries, and the [V, H] weight gradient
        assert mode.largest == max(64 * 512, v * h) < n * v
    else:  # the probe sees the plain head's logits
        assert mode.largest >= n * v


def test_models_that_transform_logits_are_refused() -> None:
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    assert unsupported_reason(model) is None
    model.config.logit_scale = 0.5
    assert "logit_scale" in str(unsupported_reason(model))
    model.config.logit_scale = None
    model.lm_head = torch.nn.Sequential(model.lm_head)  # type: ignore[assignment]
    assert "Sequential" in str(unsupported_reason(model))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_on_cuda_agrees_with_the_plain_head() -> None:
    """Under bf16 autocast both heads run the matmul in bf16 and the softmax in float32."""
    n, h, v = 1000, 256, 50_000
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(n, h, device="cuda", generator=g).requires_grad_()
    weight = (torch.randn(v, h, device="cuda", generator=g) / h**0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), device="cuda", generator=g)
    results = []
    for fused in (True, False):
        with torch.autocast("cuda", torch.bfloat16):
            if fused:
                lp, ent = fused_logprobs_entropy(hidden, weight, None, targets, 0.9, with_entropy=True)
                assert ent is not None
            else:
                lp, ent = _plain(hidden, weight, None, targets, 0.9)
        results.append((lp, ent, *_grads(lp.sum() + 0.1 * ent.sum(), [hidden, weight])))
    for name, x, y in zip(("logprobs", "entropy", "hidden", "weight"), *results, strict=True):
        torch.testing.assert_close(x.float(), y.float(), atol=2e-2, rtol=2e-2, msg=name)
