"""LoRA: only adapters train, adapters off gives the base model, and the merged export matches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, pg_loss
from safetensors.torch import load_file

from quartet.config.model import Dtype, LoraConfig
from quartet.config.optim import OptimConfig
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.hf_modules import hf_model

pytest.importorskip("peft")

PROMPTS = [4, 2, 6, 3]
RESPONSES = [3, 5, 1, 4]


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path) -> tuple[TrainingEngine, dict[str, torch.Tensor]]:
    spec = EngineSpec(
        str(tiny_model_dir),
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OptimConfig(lr=5e-2),
        lora=LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj")),
    )
    engine = TrainingEngine(spec)
    before = {k: v.clone() for k, v in engine.module.state_dict().items()}
    for _ in range(2):
        engine.train_step(make_batch(PROMPTS, RESPONSES), pg_loss, MicroSpec(size=2))
    return engine, before


def test_only_adapter_weights_change(trained: tuple[TrainingEngine, dict[str, torch.Tensor]]) -> None:
    engine, before = trained
    after = engine.module.state_dict()
    changed = {k for k, v in after.items() if not torch.equal(v, before[k])}
    adapters = {k for k in after if "lora_" in k}
    assert changed and changed <= adapters
    assert any("lora_B" in k for k in changed)  # B starts at 0: it must have moved for adapters to matter
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)


def test_adapters_disabled_gives_the_base_model(
    trained: tuple[TrainingEngine, dict[str, torch.Tensor]], tiny_model_dir: Path
) -> None:
    engine, _ = trained
    base = TrainingEngine(EngineSpec(str(tiny_model_dir), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    batch = make_batch(PROMPTS, RESPONSES, seed=5)
    base_lp, _ = base.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    with engine.adapters_disabled():
        off, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    on, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    assert torch.equal(off, base_lp)
    assert (on - base_lp).abs().max() > 1e-3  # the adapters do change the policy


def test_merged_export_reloads_with_the_adapted_logprobs(
    trained: tuple[TrainingEngine, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    engine, _ = trained
    folder = engine.export_hf(tmp_path / "hf")
    assert folder is not None and (folder / "tokenizer.json").exists()
    reloaded = TrainingEngine(EngineSpec(str(folder), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    assert not any("lora" in k for k in hf_model(reloaded.module).state_dict())
    batch = make_batch(PROMPTS, RESPONSES, seed=6)
    want, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    got, _ = reloaded.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_merged_export_keeps_tied_embeddings(
    trained: tuple[TrainingEngine, dict[str, torch.Tensor]], tmp_path: Path
) -> None:
    engine, _ = trained
    folder = engine.export_hf(tmp_path / "hf")
    assert folder is not None
    config = json.loads((folder / "config.json").read_text())
    assert config["tie_word_embeddings"] is True
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
