"""`Fp8Linear` and the fp8 model swap on CPU (emulation): the forward is dequantize-then-`F.linear` exactly,
the fp8 weight and its scales replace the full-precision weight, and the tiny model decodes as the model of
its dequantized weights does, within a stated distance of the unquantized one."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from fp8_reference import FP8, dequantized_copy, reference_quantize, teacher_forced_logits
from rollout_cases import prompt_ids, varied_model
from torch import nn

from quartet.config.rollout import FP8_PROJECTIONS
from quartet.models.loading import load_causal_lm
from quartet.rollout.torch.fp8 import (
    Fp8Linear,
    quantize_for_engine,
    quantize_layers,
    quantize_rows,
    scaled_reference,
)
from quartet.rollout.torch.model_runner import DecoderRunner


def _linear(fan_in: int, fan_out: int, bias: bool, dtype: torch.dtype, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(fan_in, fan_out, bias=bias).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_emulated_forward_is_dequantize_then_linear_exactly(dtype: torch.dtype, bias: bool) -> None:
    linear = _linear(48, 40, bias, dtype)
    module = Fp8Linear.from_linear(linear)
    x = torch.randn(3, 5, 48).to(dtype)  # a [batch, seq, in] input, as the runner feeds it
    codes, scales = reference_quantize(linear.weight)
    w = (codes.view(FP8).to(torch.float32) * scales.unsqueeze(1)).to(dtype)
    with torch.no_grad():
        got = module(x)
        want = F.linear(x, w, linear.bias)
    assert got.dtype == dtype and got.shape == (3, 5, 40)
    assert torch.equal(got, want)
    assert not torch.equal(w, linear.weight)  # it did round: the comparison is not with the original


def test_the_fp8_weight_replaces_the_full_precision_one() -> None:
    linear = _linear(64, 32, True, torch.bfloat16)
    module = Fp8Linear.from_linear(linear)
    assert [name for name, _ in module.named_parameters()] == ["bias"]  # no bf16 weight kept
    assert module.bias is linear.bias  # a sync of `<name>.bias` reaches the same tensor
    tensors = dict(module.named_buffers())
    assert {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()} == {
        "weight": (FP8, (32, 64)),
        "weight_scale": (torch.float32, (32,)),
    }
    assert sum(t.nbytes for t in tensors.values()) == 32 * 64 * 1 + 32 * 4


def test_a_cast_of_the_model_keeps_the_fp8_codes_and_scales() -> None:
    module = Fp8Linear.from_linear(_linear(32, 16, True, torch.float32))
    codes, scales = module.weight.clone(), module.weight_scale.clone()
    module.to(torch.bfloat16)
    assert module.weight.dtype == FP8
    assert torch.equal(module.weight.view(torch.uint8), codes.view(torch.uint8))
    assert module.weight_scale.dtype == torch.float32 and torch.equal(module.weight_scale, scales)
    assert module.bias is not None and module.bias.dtype == torch.bfloat16


def test_a_sync_of_another_shape_is_refused_by_name() -> None:
    module = Fp8Linear.from_linear(_linear(32, 16, False, torch.float32))
    with pytest.raises(ValueError, match=r"'layers.1.mlp.up_proj.weight' has shape \(16, 31\)"):
        module.load_weight(torch.zeros(16, 31), "layers.1.mlp.up_proj.weight")


def test_quantize_layers_swaps_the_projections_only(tiny_model_dir: Path) -> None:
    model = load_causal_lm(tiny_model_dir)
    before = {n: p.nbytes for n, p in model.named_parameters()}
    runner = DecoderRunner(model)
    count = quantize_layers(runner.layers)
    assert count == len(FP8_PROJECTIONS) * len(runner.layers)
    kinds = {n.rsplit(".", 1)[-1]: type(m).__name__ for n, m in model.named_modules()}
    assert {kinds[p] for p in FP8_PROJECTIONS} == {"Fp8Linear"}
    assert type(model.lm_head) is nn.Linear and kinds["embed_tokens"] == "Embedding"
    after = {n: t.nbytes for n, t in [*model.named_parameters(), *model.named_buffers()]}
    projections = [n for n in before if n.rsplit(".", 2)[-2] in FP8_PROJECTIONS and n.endswith(".weight")]
    assert len(projections) == count
    shapes = {n: tuple(p.shape) for n, p in load_causal_lm(tiny_model_dir).named_parameters()}
    for name in projections:  # 4-byte weights become 1-byte codes plus a float32 scale per row
        assert after[name] == before[name] // 4
        assert after[name.replace(".weight", ".weight_scale")] == 4 * shapes[name][0]
    assert all(after[n] == b for n, b in before.items() if n not in projections)


def test_decode_is_the_dequantized_models_and_near_the_original(tiny_model_dir: Path) -> None:
    """Eight teacher-forced decode steps of the varied tiny model (weights of gain 1.5, so errors grow
    through its layers): the fp8 runner's logits equal, to float32 rounding, those of the same model with
    each projection's weight replaced by its dequantized fp8 rows; against the unquantized model the
    relative RMS error of the logits is 9-15% here (measured; bound 0.25), 3% on the saved tiny model
    (weights of std 0.02), and nonzero (the weights were rounded)."""
    original = varied_model(tiny_model_dir)
    reference = copy.deepcopy(original)
    dequantized_copy(reference, FP8_PROJECTIONS)
    quantized = copy.deepcopy(original)
    quantize_layers(DecoderRunner(quantized).layers)
    prompts = prompt_ids(tiny_model_dir)
    got = teacher_forced_logits(DecoderRunner(quantized), prompts, 8)
    want = teacher_forced_logits(DecoderRunner(reference), prompts, 8)
    exact = teacher_forced_logits(DecoderRunner(original), prompts, 8)
    for g, w, e in zip(got, want, exact, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
        relative = float((g - e).norm() / e.norm())
        assert 1e-3 < relative < 0.25


def test_the_device_paths_math_adds_only_the_activation_rounding() -> None:
    """`scaled_reference` (per-token fp8 activations x fp8 weight, the product `_scaled_mm` computes) is
    within the activations' rounding of the emulated forward: relative RMS <= 2^-4 (measured ~2^-5.5)."""
    linear = _linear(128, 64, True, torch.float32, seed=1)
    module = Fp8Linear.from_linear(linear)
    x = torch.randn(2, 9, 128) * torch.logspace(-2, 1, 9).unsqueeze(1)  # tokens of different scales
    with torch.no_grad():
        emulated = module(x)
        device_math = scaled_reference(x, module.weight, module.weight_scale, module.bias)
    assert device_math.shape == emulated.shape
    relative = float((device_math - emulated).norm() / emulated.norm())
    assert 0 < relative <= 2.0**-4
    q, s = quantize_rows(linear.weight)
    assert torch.equal(q.view(torch.uint8), module.weight.view(torch.uint8))
    assert torch.equal(s, module.weight_scale)


def test_an_engine_on_a_gpu_without_scaled_fp8_is_warned(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Emulated projections save memory but decode slower: on a CUDA device that is worth a warning (the
    device is only named here: nothing runs on it), on the CPU only the count is logged."""
    layers = DecoderRunner(load_causal_lm(tiny_model_dir)).layers
    with caplog.at_level("INFO", logger="quartet.rollout.torch.fp8"):
        modules = quantize_for_engine(layers, torch.device("cpu"))
    assert len(modules) == 14 and not any(m.scaled for m in modules)
    assert [r.levelname for r in caplog.records] == ["INFO"] and "14 projections, 14 emulated" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="quartet.rollout.torch.fp8"):
        again = quantize_for_engine(layers, torch.device("cuda"))
    assert [m is n for m, n in zip(again, modules, strict=True)] == [True] * 14  # nothing quantized twice
    warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warning) == 1 and "14 of 14 projections run emulated" in warning[0]
