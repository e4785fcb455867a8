"""On a CUDA device: the real varlen kernel equals the per-span path in packed and shared-prompt attention."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_cases import make_batch
from test_gpu import PROMPTS, RESPONSES, _spec
from test_varlen_kernel import BOUNDS, SPANS

from quartet.config.model import Dtype
from quartet.engines import MicroSpec, TrainingEngine, varlen_kernel
from quartet.engines.packing import varlen_attention
from quartet.engines.shared_prompts import span_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _attend(shared: bool, window: int | None, qkv: list[torch.Tensor]) -> list[torch.Tensor]:
    q, k, v = (t.detach().clone().requires_grad_() for t in qkv)
    if shared:
        out = span_attention(q, k, v, None, SPANS.to(q.device), sliding_window=window)
    else:
        bounded = varlen_attention(
            torch.nn.Module(), q, k, v, None, quartet_bounds=BOUNDS, sliding_window=window
        )
        out = bounded[0]
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out)
    (out.float() * weights.float()).sum().backward()
    return [out.detach().float(), q.grad.float(), k.grad.float(), v.grad.float()]  # type: ignore[union-attr]


@pytest.mark.parametrize("shared", [False, True], ids=["rows", "shared"])
@pytest.mark.parametrize("window", [None, 3])
def test_the_kernel_equals_the_per_span_path(shared: bool, window: int | None) -> None:
    tokens = 15 if shared else 22
    g = torch.Generator().manual_seed(0)
    shapes = [(1, 4, tokens, 64), (1, 2, tokens, 64), (1, 2, tokens, 64)]
    qkv: list[Any] = [torch.randn(s, generator=g).to("cuda", torch.bfloat16) for s in shapes]
    name = varlen_kernel.varlen_kernel_name(qkv[0], qkv[2], window)
    if name is None:
        pytest.skip("no varlen kernel in this torch (and no flash-attn) for these inputs")
    varlen_kernel.set_varlen_kernel(False)
    try:
        want = _attend(shared, window, qkv)
    finally:
        varlen_kernel.set_varlen_kernel(True)
    got = _attend(shared, window, qkv)
    assert varlen_kernel.varlen_kernel_off() is None, varlen_kernel.varlen_kernel_off()
    for label, a, b in zip(("output", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2, msg=f"{name}: {label}")


def test_the_engine_calls_the_kernel_under_its_autocast(tiny_model_dir: Path) -> None:
    """float32 master weights, bf16 autocast, packed passes: the engine's own setup takes the kernel (its
    queries and keys arrive in float32 from the rotary embedding), and the log-probs agree span by span."""
    engine = TrainingEngine(replace(_spec(tiny_model_dir, Dtype.BFLOAT16), remove_padding=True))
    batch = make_batch(PROMPTS, RESPONSES)
    before = varlen_kernel.varlen_kernel_calls()
    got, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=2))
    layers = engine.module.config.num_hidden_layers
    assert varlen_kernel.varlen_kernel_calls() - before == 2 * layers, varlen_kernel.varlen_kernel_off()
    varlen_kernel.set_varlen_kernel(False)
    try:
        want, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=2))
    finally:
        varlen_kernel.set_varlen_kernel(True)
    torch.testing.assert_close(got, want, atol=5e-2, rtol=0)
