"""The runner's decode step through the fused kernels equals its own torch step; the engine's selector.

The Triton kernels run under the interpreter (conftest.py) on a tiny Qwen2 with varied weights; the torch
forms of the same fused operations (`torch_kernels`) must give the runner's own step bit for bit.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from quartet.config import FusedKernels, RolloutConfig, load_config
from quartet.config.errors import ConfigError
from quartet.models.loading import load_causal_lm
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.torch.graph_decode import BucketedDecoder
from quartet.rollout.torch.kernels import (
    DecodeKernels,
    GuardedKernel,
    KernelsUnavailableError,
    sampler,
    select_kernels,
    torch_kernels,
    triton_kernels,
)
from quartet.rollout.torch.kv_cache import SlotKVCache
from quartet.rollout.torch.model_runner import DecoderRunner

PROMPTS = [[5, 17, 33, 2, 9], [41, 7], [3, 8, 13, 21, 34, 55, 89]]


def _model(folder: Path, dtype: torch.dtype) -> torch.nn.Module:
    """The tiny model with larger random weights (its saved ones give nearly flat logits)."""
    model = load_causal_lm(folder)
    model.train(False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.5 / param.shape[1] ** 0.5, generator=gen)
            else:
                param.normal_(1.0, 0.2, generator=gen)  # norm weights away from 1: a missed weight shows
    return model.to(dtype)


def _decode(
    runner: DecoderRunner, kernels: DecodeKernels | None, steps: int
) -> tuple[list[torch.Tensor], SlotKVCache]:
    """Prefill PROMPTS, then `steps` greedy decode steps with `kernels`: each step's logits, and the cache."""
    runner.kernels = None
    cache = runner.new_cache(len(PROMPTS) + 1)
    cache.ensure_capacity(64, used=0)
    ids = torch.zeros(len(PROMPTS), max(map(len, PROMPTS)), dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        ids[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in PROMPTS])
    logits = runner.prefill(ids, lengths, cache, 0, None)
    runner.kernels = kernels
    out = []
    for _ in range(steps):
        logits = runner.decode(logits.argmax(-1), lengths, int(lengths.max()) + 1, cache)
        out.append(logits)
        lengths = lengths + 1
    runner.kernels = None
    return out, cache


@torch.inference_mode()
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_step_equals_the_runners_step(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    runner = DecoderRunner(_model(tiny_model_dir, dtype))
    assert runner.fusable
    plain, plain_cache = _decode(runner, None, 3)
    fused_torch, torch_cache = _decode(runner, torch_kernels(), 3)
    fused_triton, triton_cache = _decode(runner, triton_kernels(), 3)
    for want, same, close in zip(plain, fused_torch, fused_triton, strict=True):
        assert torch.equal(same, want)  # the same torch operations, regrouped
        _assert_near(close, want, dtype)
    for layer in range(len(runner.layers)):
        assert torch.equal(torch_cache.keys[layer], plain_cache.keys[layer])
        assert torch.equal(torch_cache.values[layer], plain_cache.values[layer])
        _assert_near(triton_cache.keys[layer], plain_cache.keys[layer], dtype)
        _assert_near(triton_cache.values[layer], plain_cache.values[layer], dtype)


def _assert_near(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """float32: summation order only (1e-4). bfloat16: the interpreter truncates where torch rounds
    (kernel_tolerances.py), and the differences pass through two layers of bfloat16 matmuls: within 2**-4 of
    the tensor's largest magnitude (a wrong column, head or weight is off by the magnitude itself)."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    else:
        assert float((got.float() - want.float()).abs().max()) <= 2**-4 * float(want.float().abs().max())


@pytest.mark.parametrize("filtered", [False, True])
def test_the_engine_decodes_through_the_kernels(
    tiny_model_dir: Path, filtered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end, plain and with top-k and top-p (the ranked kernel switched on): each token's log-prob, as
    the engine whose runner and sampler are the Triton kernels reports it, is the model's own (a full
    forward's)."""
    monkeypatch.setattr(sampler, "RANKED_KERNEL", True)
    model = _model(tiny_model_dir, torch.float32)
    filters = {"top_k": 20, "top_p": 0.9} if filtered else {}
    params = SamplingParams(max_new_tokens=2, temperature=0.8, seed=3, n=2, ignore_eos=True, **filters)
    with TorchRolloutEngine(model, max_num_seqs=2, fused_kernels="off") as engine:
        engine.runner.kernels = triton_kernels()
        outputs = engine.generate([GenerationRequest(tuple(PROMPTS[0]), params)])[0]
    assert len(outputs) == 2
    for out in outputs:
        assert len(out.token_ids) == 2 and out.logprobs is not None
        ids = torch.tensor([PROMPTS[0] + list(out.token_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(PROMPTS[0]) - 1 : -1].float()
        want = torch.log_softmax(logits / 0.8, -1).gather(1, torch.tensor(out.token_ids).unsqueeze(1))[:, 0]
        torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-4, rtol=0)


def test_the_kernels_sample_inside_the_bucketed_step(tiny_model_dir: Path) -> None:
    """The fused sampler inside the decoder's step (what a CUDA graph records): each token's log-prob is
    the model's own, as when it samples after the step."""
    model = _model(tiny_model_dir, torch.float32)
    params = SamplingParams(max_new_tokens=3, temperature=0.8, seed=5, n=2, ignore_eos=True)
    with TorchRolloutEngine(model, max_num_seqs=2, fused_kernels="off") as engine:
        engine.runner.kernels = triton_kernels()
        engine.core.decoder = BucketedDecoder(engine.runner, 2, capture=False)
        outputs = engine.generate([GenerationRequest(tuple(PROMPTS[0]), params)])[0]
        assert any(len(key) > 2 for key in engine.core.decoder._buckets)  # it sampled inside the step
    for out in outputs:
        ids = torch.tensor([PROMPTS[0] + list(out.token_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(PROMPTS[0]) - 1 : -1].float()
        want = torch.log_softmax(logits / 0.8, -1).gather(1, torch.tensor(out.token_ids).unsqueeze(1))[:, 0]
        torch.testing.assert_close(torch.tensor(out.logprobs), want, atol=1e-4, rtol=0)


def test_the_selector_keeps_the_torch_path_off_cuda_and_names_why_under_on(tiny_model_dir: Path) -> None:
    cpu = torch.device("cpu")
    assert select_kernels("auto", cpu) is None and select_kernels("off", cpu) is None
    with pytest.raises(KernelsUnavailableError, match="runs on cpu.*set it to auto or off"):
        select_kernels("on", cpu)
    with pytest.raises(ValueError, match="fused_kernels must be one of"):
        select_kernels("yes", cpu)
    model = _model(tiny_model_dir, torch.float32)
    with TorchRolloutEngine(model, max_num_seqs=1) as engine:
        assert engine.runner.kernels is None  # auto on CPU: nothing changes
    with pytest.raises(KernelsUnavailableError, match="fused_kernels=on"):
        TorchRolloutEngine(model, max_num_seqs=1, fused_kernels="on")


def test_the_config_key_is_checked(tmp_path: Path) -> None:
    assert RolloutConfig().fused_kernels is FusedKernels.AUTO
    with pytest.raises(ConfigError, match="fused_kernels"):
        RolloutConfig(fused_kernels="maybe")  # type: ignore[arg-type]
    run = tmp_path / "run.yaml"
    run.write_text("rollout:\n  fused_kernels: off\n")  # a YAML 1.1 boolean, read as the string
    assert load_config(run).rollout.fused_kernels is FusedKernels.OFF
    with pytest.raises(
        ConfigError, match=r"(?s)rollout.fused_kernels: 'yes'.*use one of \['auto', 'off', 'on'\]"
    ):
        load_config(run, ("rollout.fused_kernels=yes",))


def test_a_kernel_that_fails_falls_back_to_its_torch_path_once(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def broken(x: torch.Tensor) -> torch.Tensor:
        calls.append("kernel")
        raise RuntimeError("no such shape\ndetails")

    def fallback(x: torch.Tensor) -> torch.Tensor:
        calls.append("torch")
        return x + 1

    guarded = GuardedKernel("rope_cache", broken, fallback, strict=False)
    with caplog.at_level(logging.WARNING):
        assert guarded(torch.zeros(2)).tolist() == [1.0, 1.0]
        assert guarded(torch.ones(2)).tolist() == [2.0, 2.0]
    assert calls == ["kernel", "torch", "torch"]  # the kernel is not tried again
    lines = [r.getMessage() for r in caplog.records if "rope_cache" in r.getMessage()]
    want = "fused decode kernel rope_cache failed (RuntimeError: no such shape); using its torch path"
    assert lines == [want + " from now on"]
    strict = GuardedKernel("sample", broken, fallback, strict=True)
    with pytest.raises(
        KernelsUnavailableError, match="the sample kernel failed .RuntimeError: no such shape"
    ):
        strict(torch.zeros(1))
