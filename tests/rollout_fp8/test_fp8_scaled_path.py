"""The device path of `Fp8Linear` (per-token fp8 activations x fp8 weights through `torch._scaled_mm`), run
on the CPU, whose torch has the same kernel interface: its product against `scaled_reference` (the float32
twin), the activations quantized once per input tensor, and the tiny model's decode through it against the
emulated path (the weights' rounding alone)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from fp8_reference import teacher_forced_logits
from rollout_cases import prompt_ids, varied_model
from torch import nn

from quartet.rollout.torch.fp8 import Fp8Linear, TokenQuantizer, quantize_layers, scaled_reference
from quartet.rollout.torch.model_runner import DecoderRunner

pytestmark = pytest.mark.skipif(not hasattr(torch, "_scaled_mm"), reason="this torch has no _scaled_mm")


def _module(fan_in: int, fan_out: int, bias: bool, seed: int = 0) -> Fp8Linear:
    torch.manual_seed(seed)
    module = Fp8Linear.from_linear(nn.Linear(fan_in, fan_out, bias=bias).to(torch.bfloat16))
    module.scaled = True
    return module


@pytest.mark.parametrize("bias", [True, False])
def test_the_scaled_product_is_its_float32_twin(bias: bool) -> None:
    module = _module(96, 48, bias)
    x = torch.randn(3, 7, 96).to(torch.bfloat16) * torch.logspace(-2, 1, 7).unsqueeze(1).to(torch.bfloat16)
    with torch.no_grad():
        got = module(x)
        want = scaled_reference(x, module.weight, module.weight_scale, module.bias)
        emulated = nn.functional.linear(x, module.dequantized(), module.bias)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 7, 48)
    # bf16 roundings apart: of the product, then of the bias added to it (the twin rounds once, at the end)
    scale = float(want.abs().max())
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7 * scale)
    assert not torch.equal(got, emulated)  # the activations were rounded too: another product


def test_one_input_is_quantized_once_for_the_projections_sharing_it() -> None:
    shared = TokenQuantizer()
    q, k = _module(64, 32, False, seed=1), _module(64, 16, False, seed=2)
    q.tokens = k.tokens = shared
    h = torch.randn(5, 64).to(torch.bfloat16)
    with torch.no_grad():
        q(h)
        first = shared(h)
        k(h)
        assert shared(h)[0] is first[0]  # k reused q's quantization of h
        twin = h.clone()  # equal values, another tensor: quantized anew, to the same codes
        again = shared(twin)
        assert again[0] is not first[0]
        assert torch.equal(again[0].view(torch.uint8), first[0].view(torch.uint8))
        for module in (q, k):
            want = scaled_reference(h, module.weight, module.weight_scale)
            torch.testing.assert_close(module(h).float(), want.float(), rtol=2**-7, atol=1e-6)


def test_the_tiny_model_decodes_through_the_scaled_path(tiny_model_dir: Path) -> None:
    """Eight teacher-forced decode steps of the varied tiny model in bfloat16: with the quantizer shared
    model-wide the logits equal those with one quantizer per projection exactly, and they stay near the
    emulated path's (weights rounded, activations not): relative RMS 10-17% measured on this model of
    gain 1.5, whose layers amplify errors (as the weights' own rounding: 9-15%), bound 0.25."""
    base = varied_model(tiny_model_dir).to(torch.bfloat16)
    quantize_layers(DecoderRunner(base).layers)
    emulated = copy.deepcopy(base)
    scaled = copy.deepcopy(base)
    separate = copy.deepcopy(base)
    for name, module in scaled.named_modules():
        if isinstance(module, Fp8Linear):
            module.scaled = True
            twin = separate.get_submodule(name)
            assert isinstance(twin, Fp8Linear)
            twin.scaled, twin.tokens = True, TokenQuantizer()
    prompts = prompt_ids(tiny_model_dir)
    got = teacher_forced_logits(DecoderRunner(scaled), prompts, 8)
    alone = teacher_forced_logits(DecoderRunner(separate), prompts, 8)
    reference = teacher_forced_logits(DecoderRunner(emulated), prompts, 8)
    for g, a, r in zip(got, alone, reference, strict=True):
        assert torch.equal(g, a)
        relative = float((g - r).norm() / r.norm())
        assert 1e-4 < relative < 0.25
