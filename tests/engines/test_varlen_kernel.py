"""The varlen kernel path of packed attention (`engines.varlen_kernel`), checked on CPU.

The flash kernels run on CUDA only. Here a float64 emulation of their contract stands in for them: causal
attention within each span of `cu_seq_q` / `cu_seq_k`, aligned to the end of the span's keys, with the
window (left, 0). It shows the packed and shared-prompt passes hand the kernel the right layout, offsets,
scale and heads: their outputs and gradients equal the per-span path's. tests/engines/test_gpu.py checks
the real kernels against the per-span path on a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_cases import surrogate_grads
from test_shared_prompts import _engine, grpo_batch

from quartet.engines import MicroSpec, varlen_kernel
from quartet.engines.packing import varlen_attention
from quartet.engines.shared_prompts import AttentionSpans, span_attention


def _flash_contract(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    window_size: tuple[int, int],
    top_left: bool = False,
) -> torch.Tensor:
    """[T_q, H, D] of flash attention's varlen contract, position by position in float64 (`top_left`: the
    causal mask aligned to the start of the keys, a kernel that got it wrong)."""
    heads = query.shape[1]
    key = key.repeat_interleave(heads // key.shape[1], dim=1)
    value = value.repeat_interleave(heads // value.shape[1], dim=1)
    left, right = window_size
    outs = []
    for i in range(cu_q.numel() - 1):
        q = query[int(cu_q[i]) : int(cu_q[i + 1])].double()
        k = key[int(cu_k[i]) : int(cu_k[i + 1])].double()
        v = value[int(cu_k[i]) : int(cu_k[i + 1])].double()
        n, m = q.shape[0], k.shape[0]
        assert 0 < n <= max_q and n <= m <= max_k
        s = q.shape[-1] ** -0.5 if scale is None else scale
        scores = torch.einsum("nhd,mhd->hnm", q, k) * s
        at = torch.arange(n)[:, None] + (0 if top_left else m - n)  # query i is key (m - n + i)
        key_at = torch.arange(m)[None, :]
        allowed = key_at <= at + right
        if left >= 0:
            allowed &= key_at >= at - left
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        outs.append(torch.einsum("hnm,mhd->nhd", probs, v))
    return torch.cat(outs).to(query.dtype)


class TorchVarlen:
    """torch's `varlen_attn` as of torch 2.13 (scale, window, GQA keywords), emulated; counts its calls."""

    top_left = False
    """Align the causal mask to the start of a span's keys: a kernel that got it wrong."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        *,
        return_aux=None,  # fmt: skip
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
        seqused_k=None,
        block_table=None,
        num_splits=None,
    ):
        assert enable_gqa or query.shape[1] == key.shape[1]
        self.calls.append({"heads": (query.shape[1], key.shape[1]), "window": window_size, "scale": scale})
        self.dtypes = (query.dtype, key.dtype, value.dtype)
        out = _flash_contract(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale, window_size, self.top_left
        )
        return self.answer(out)

    def answer(self, out: torch.Tensor) -> torch.Tensor:
        """What the kernel returns for its output (a faulty kernel's hook)."""
        return out


class FirstTorchVarlen(TorchVarlen):
    """An earlier torch's `varlen_attn`: `is_causal` only; no scale, window or fewer key/value heads."""

    def __call__(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):  # type: ignore[override]  # fmt: skip
        assert query.shape[1] == key.shape[1], "this release takes as many key/value heads as query heads"
        self.calls.append({"heads": (query.shape[1], key.shape[1]), "causal": is_causal})
        window = (-1, 0) if is_causal else (-1, -1)
        return _flash_contract(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, None, window)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[TorchVarlen]:
    """The emulated torch kernel, taken for CPU float32 tensors as the real one is for CUDA half ones."""
    fake = TorchVarlen()
    yield from _installed(monkeypatch, fake)


@pytest.fixture
def first_kernel(monkeypatch: pytest.MonkeyPatch) -> Iterator[TorchVarlen]:
    fake = FirstTorchVarlen()
    yield from _installed(monkeypatch, fake)


def _installed(monkeypatch: pytest.MonkeyPatch, fake: TorchVarlen) -> Iterator[TorchVarlen]:
    monkeypatch.setattr(varlen_kernel, "_kernel_dtype", lambda query: query.dtype)
    monkeypatch.setattr(varlen_kernel, "_torch_varlen", lambda: fake)
    monkeypatch.setattr(varlen_kernel, "_flash_attn_varlen", lambda: None)
    varlen_kernel._takes.cache_clear()
    varlen_kernel._probe.cache_clear()
    varlen_kernel.set_varlen_kernel(True)
    yield fake
    varlen_kernel._takes.cache_clear()
    varlen_kernel._probe.cache_clear()
    varlen_kernel.set_varlen_kernel(True)


def _qkv(tokens: int, heads: int = 4, kv_heads: int = 2, dim: int = 16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(1, heads, tokens, dim), (1, kv_heads, tokens, dim), (1, kv_heads, tokens, dim)]
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


BOUNDS = (0, 5, 5, 12, 13, 22)
"""Rows of 5, 0, 7, 1 and 9 tokens."""

SPANS = AttentionSpans(
    query_lengths=(5, 3, 4, 2, 1),
    key_index=torch.tensor([*range(5), *range(5), 5, 6, 7, *range(5), 8, 9, 10, 11, 12, 13, 12, 13, 14]),
    key_lengths=(5, 8, 9, 2, 3),
)
"""A prompt of 5 tokens with responses of 3 and 4, then a prompt of 2 with a response of 1."""


def _plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
    return varlen_attention(torch.nn.Module(), q, k, v, None, quartet_bounds=BOUNDS, **kw)[0]


def _outputs_and_grads(fn: Any, tokens: int, **kw: Any) -> list[torch.Tensor]:
    q, k, v = _qkv(tokens)
    out = fn(q, k, v, **kw)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * weights).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]  # type: ignore[list-item]


def _per_span(fn: Any, tokens: int, **kw: Any) -> list[torch.Tensor]:
    varlen_kernel.set_varlen_kernel(False)
    try:
        return _outputs_and_grads(fn, tokens, **kw)
    finally:
        varlen_kernel.set_varlen_kernel(True)


def _shared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
    return span_attention(q, k, v, kw.pop("scaling", None), SPANS, **kw)


CASES = [
    pytest.param(_plain, 22, {}, id="rows"),
    pytest.param(_plain, 22, {"scaling": 0.3}, id="rows-scaled"),
    pytest.param(_plain, 22, {"sliding_window": 3}, id="rows-window"),
    pytest.param(_shared, 15, {}, id="shared"),
    pytest.param(_shared, 15, {"scaling": 0.3, "sliding_window": 4}, id="shared-scaled-window"),
]


@pytest.mark.parametrize(("fn", "tokens", "kw"), CASES)
def test_one_kernel_call_equals_the_per_span_path(
    kernel: TorchVarlen, fn: Any, tokens: int, kw: dict
) -> None:
    want = _per_span(fn, tokens, **kw)
    got = _outputs_and_grads(fn, tokens, **kw)
    assert len(kernel.calls) == 2  # the first call of a kind of input is a probe's (below)
    call = kernel.calls[1]
    assert call["heads"] == (4, 2)  # the kernel's own GQA: key/value heads not repeated
    window = kw.get("sliding_window")
    assert call["window"] == (-1 if window is None else window - 1, 0)
    assert call["scale"] == kw.get("scaling")
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize(("fn", "tokens", "kw"), [c for c in CASES if "sliding_window" not in c.values[2]])
def test_the_first_torch_kernel_gets_repeated_heads_and_a_scaled_query(
    first_kernel: TorchVarlen, fn: Any, tokens: int, kw: dict
) -> None:
    want = _per_span(fn, tokens, **kw)
    got = _outputs_and_grads(fn, tokens, **kw)
    assert first_kernel.calls == [{"heads": (4, 4), "causal": True}] * 2  # a probe's call, then the pass
    for name, a, b in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)


def test_a_window_the_first_torch_kernel_cannot_take_runs_span_by_span(first_kernel: TorchVarlen) -> None:
    want = _per_span(_plain, 22, sliding_window=3)
    got = _outputs_and_grads(_plain, 22, sliding_window=3)
    assert first_kernel.calls == []
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_sinks_run_span_by_span(kernel: TorchVarlen) -> None:
    q, k, v = _qkv(22)
    sinks = torch.randn(4)
    got = _plain(q, k, v, s_aux=sinks)
    varlen_kernel.set_varlen_kernel(False)
    want = _plain(q, k, v, s_aux=sinks)
    assert kernel.calls == []
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_failing_kernel_is_reported_once_and_left(
    kernel: TorchVarlen, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = []

    def broken(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    monkeypatch.setattr(varlen_kernel, "_torch_varlen", lambda: broken)
    want = _per_span(_plain, 22)
    with caplog.at_level(logging.WARNING, logger=varlen_kernel.__name__):
        first = _outputs_and_grads(_plain, 22)
        second = _outputs_and_grads(_shared, 15)
    assert calls == [1]  # the probe's
    assert [r.getMessage() for r in caplog.records] == [
        "torch's varlen kernel failed a probe: RuntimeError: FlashAttention only supports Ampere GPUs or "
        "newer.; packed attention runs span by span from now on"
    ]
    assert second[0].shape == (1, 15, 4, 16)
    for a, b in zip(first, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_offsets_are_built_once_per_micro_batch(kernel: TorchVarlen) -> None:
    q, k, v = _qkv(22)
    for _ in range(3):  # three layers of one micro-batch
        _plain(q, k, v)
    first = varlen_kernel._offsets((5, 7, 1, 9), torch.device("cpu"))
    assert first.tolist() == [0, 5, 12, 13, 22] and first.dtype == torch.int32
    assert varlen_kernel._offsets((5, 7, 1, 9), torch.device("cpu")) is first


def test_cpu_float32_takes_no_kernel() -> None:
    q, k, v = _qkv(4)
    assert varlen_kernel.varlen_kernel_name(q, v) is None
    assert varlen_kernel.kernel_attention(q, k, v, None, (4,), (4,)) is None


def test_under_autocast_the_kernel_gets_autocasts_dtype(
    kernel: TorchVarlen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32 master weights under bf16 autocast: rotary embeddings hand over float32 queries and keys,
    and autocast leaves a custom kernel's inputs alone, so the path casts them as autocast casts SDPA's."""
    monkeypatch.setattr(varlen_kernel, "_kernel_dtype", varlen_kernel._half_dtype)  # all but the CUDA check
    q, k, v = (t.detach() for t in _qkv(22))
    assert _plain(q, k, v).dtype == torch.float32 and kernel.calls == []  # float32 without autocast: per span
    before = varlen_kernel.varlen_kernel_calls()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _plain(q, k, v)
    assert kernel.dtypes == (torch.bfloat16,) * 3 and out.dtype == torch.bfloat16
    assert varlen_kernel.varlen_kernel_calls() == before + 1  # the pass's (a probe's is not counted)
    cast = [t.to(torch.bfloat16) for t in (q, k, v)]
    varlen_kernel.set_varlen_kernel(False)
    torch.testing.assert_close(out, _plain(*cast), rtol=2e-2, atol=2e-2)  # per span on the cast inputs


class _NoBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("FlashAttention backward for head dim > 192 requires A100/A800 or H100/H800")


class BackwardFails(TorchVarlen):
    """A kernel whose forward answers and whose backward raises."""

    def answer(self, out: torch.Tensor) -> torch.Tensor:
        return _NoBackward.apply(out)


class AlignedToTheStart(TorchVarlen):
    """A kernel that aligns the causal mask to the start of a span's keys."""

    top_left = True


@pytest.mark.parametrize(
    ("faulty", "reason"),
    [
        (BackwardFails, "failed a probe: RuntimeError: FlashAttention backward"),
        (AlignedToTheStart, "differs from SDPA by"),
    ],
    ids=["backward-raises", "misaligned"],
)
def test_a_probe_keeps_a_faulty_kernel_out_of_the_pass(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, faulty: type[TorchVarlen], reason: str
) -> None:
    """The first call of a kind of input probes the kernel, forward and backward, against SDPA: a kernel
    that fails either is never used by a pass (a backward failure would fail the update past the forward's
    fallback)."""
    fake = faulty()
    installed = _installed(monkeypatch, fake)
    next(installed)
    want = _per_span(_shared, 15)
    with caplog.at_level(logging.WARNING, logger=varlen_kernel.__name__):
        got = _outputs_and_grads(_shared, 15)
    assert len(fake.calls) == 1  # the probe's; the pass ran span by span
    assert reason in str(varlen_kernel.varlen_kernel_off())
    assert len(caplog.records) == 1
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    next(installed, None)


@pytest.mark.parametrize("share", [False, True], ids=["rows", "shared-prompts"])
def test_the_engine_through_the_kernel_equals_it_span_by_span(
    kernel: TorchVarlen, tiny_model_dir: Path, share: bool
) -> None:
    """The engine's packed passes (GRPO-like micro-batches, shared prompts or not) through the kernel path:
    one call per layer and micro-batch, and the same log-probs, entropy and gradients as span by span."""
    engine = _engine(tiny_model_dir, share)
    batch = grpo_batch(seed=3)
    layers = engine.module.config.num_hidden_layers
    got_lp, got_ent = engine.forward_logprobs(batch, 0.8, MicroSpec(size=3), with_entropy=True)
    assert len(kernel.calls) == 1 + 3 * layers  # a probe's, then 3 micro-batches of 8 rows
    got_grads = surrogate_grads(engine, batch, 0.8)
    varlen_kernel.set_varlen_kernel(False)
    want_lp, want_ent = engine.forward_logprobs(batch, 0.8, MicroSpec(size=3), with_entropy=True)
    want_grads = surrogate_grads(engine, batch, 0.8)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_ent, want_ent, atol=1e-5, rtol=0)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 10
    for name, grad in want_grads.items():
        scale = max(1.0, float(grad.abs().max()))
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5 * scale, rtol=1e-4, msg=name)
