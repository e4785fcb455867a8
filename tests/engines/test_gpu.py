"""On a CUDA device: log-probs agree with the CPU engine, and offload really moves state to host memory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, pg_loss

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [4, 2, 6, 3]
RESPONSES = [3, 5, 1, 4]


def _spec(path: Path, precision: Dtype = Dtype.FLOAT32) -> EngineSpec:
    return EngineSpec(
        str(path),
        ModelKind.CAUSAL_LM,
        precision,
        optim=OptimConfig(lr=1e-3),
        param_offload=True,
        optimizer_offload=True,
    )


def test_cuda_logprobs_match_cpu(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    gpu = TrainingEngine(_spec(tiny_model_dir))
    assert gpu.device.type == "cuda"
    got, _ = gpu.forward_logprobs(batch, 1.0, MicroSpec(size=2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cpu = TrainingEngine(_spec(tiny_model_dir))
    want, _ = cpu.forward_logprobs(batch, 1.0, MicroSpec(size=2))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_packed_cuda_logprobs_match_cpu(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, fused: bool
) -> None:
    """remove_padding on CUDA: the packing indexes a micro-batch already on the GPU (it mixed devices)."""
    batch = make_batch(PROMPTS, RESPONSES)
    packed = replace(_spec(tiny_model_dir), remove_padding=True, fused_head=fused)
    got, _ = TrainingEngine(packed).forward_logprobs(batch, 1.0, MicroSpec(size=2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    want, _ = TrainingEngine(replace(packed, fused_head=False)).forward_logprobs(
        batch, 1.0, MicroSpec(size=2)
    )
    torch.testing.assert_close(got.cpu(), want, atol=1e-4, rtol=0)


def test_offload_moves_to_host_and_back(tiny_model_dir: Path) -> None:
    engine = TrainingEngine(_spec(tiny_model_dir, Dtype.BFLOAT16))
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_step(batch, pg_loss, MicroSpec(size=2))
    before = {k: v.detach().cpu().clone() for k, v in engine.module.state_dict().items()}
    engine.offload()  # no force needed: the compute device is not host memory
    assert all(p.device.type == "cpu" for p in engine.module.parameters())
    assert all(s["exp_avg"].device.type == "cpu" for s in engine.optimizer.state.values())  # type: ignore[union-attr]
    engine.onload()
    assert all(p.device.type == "cuda" for p in engine.module.parameters())
    for k, v in engine.module.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k
    engine.train_step(batch, pg_loss, MicroSpec(size=2))
