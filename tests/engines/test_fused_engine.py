"""The engine with `fused_head` on against the same engine with it off: the same log-probs and entropy, the
same gradients and the same optimizer step, padded and packed, tied (Qwen2) and untied (Llama) heads, LoRA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, pg_loss, surrogate_grads

from quartet.config import TinyModelConfig
from quartet.config.model import Dtype, LoraConfig, TinyArch
from quartet.config.optim import OptimConfig
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.models.tiny import ensure_tiny_model

PROMPTS = [5, 9, 3, 12, 1, 7]
RESPONSES = [4, 1, 11, 6, 9, 2]
OPTIM = OptimConfig(lr=1e-3)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama whose lm_head is its own weight (not tied to the embeddings)."""
    spec = TinyModelConfig(arch=TinyArch.LLAMA, tie_word_embeddings=False)
    return ensure_tiny_model(spec, tmp_path_factory.mktemp("llama"))


def _engine(path: Path, fused: bool, packed: bool = False, lora: LoraConfig | None = None) -> TrainingEngine:
    spec = EngineSpec(
        str(path),
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OPTIM,
        remove_padding=packed,
        fused_head=fused,
        lora=lora,
    )
    engine = TrainingEngine(spec)
    assert engine.fused_head is fused
    return engine


def _grads(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=14, response_width=13, seed=5)
    return surrogate_grads(engine, batch, 0.7)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("arch", ["qwen2_tied", "llama_untied"])
def test_fused_logprobs_entropy_and_gradients_equal_the_plain_head(
    tiny_model_dir: Path, llama_dir: Path, arch: str, packed: bool
) -> None:
    path = tiny_model_dir if arch == "qwen2_tied" else llama_dir
    plain, fused = _engine(path, False, packed), _engine(path, True, packed)
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=14, response_width=13, seed=3)
    micro = MicroSpec(size=4)
    lp_plain, ent_plain = plain.forward_logprobs(batch, 0.7, micro, with_entropy=True)
    lp_fused, ent_fused = fused.forward_logprobs(batch, 0.7, micro, with_entropy=True)
    assert ent_plain is not None and ent_fused is not None
    torch.testing.assert_close(lp_fused, lp_plain, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_fused, ent_plain, atol=1e-5, rtol=0)
    assert (lp_fused[batch["response_mask"] == 0] == 0).all()
    g_plain, g_fused = _grads(plain), _grads(fused)
    assert g_plain.keys() == g_fused.keys() and any("lm_head" in n or "embed" in n for n in g_plain)
    for name in g_plain:
        scale = max(1.0, float(g_plain[name].abs().max()))
        torch.testing.assert_close(g_fused[name], g_plain[name], atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_fused_train_step_matches_the_plain_one(tiny_model_dir: Path, packed: bool) -> None:
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=14, response_width=13, seed=7)
    engines = [_engine(tiny_model_dir, fused, packed) for fused in (False, True)]
    results = [e.train_step(batch, pg_loss, MicroSpec(size=3), temperature=1.0) for e in engines]
    assert results[1]["loss"] == pytest.approx(results[0]["loss"], abs=1e-6)
    assert results[1]["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-5)
    after = [e.forward_logprobs(batch, 1.0, MicroSpec(size=6))[0] for e in engines]
    torch.testing.assert_close(after[1], after[0], atol=1e-5, rtol=0)


def test_fused_head_under_lora(tiny_model_dir: Path) -> None:
    """PEFT wraps the model; the lm_head stays a plain linear and the adapters' gradients agree."""
    lora = LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj"))
    plain, fused = _engine(tiny_model_dir, False, lora=lora), _engine(tiny_model_dir, True, lora=lora)
    g_plain, g_fused = _grads(plain), _grads(fused)
    assert g_plain.keys() == g_fused.keys() and all("lora" in n for n in g_plain)
    for name in g_plain:
        torch.testing.assert_close(g_fused[name], g_plain[name], atol=1e-6, rtol=1e-4, msg=name)
    with fused.adapters_disabled():
        lp_fused, _ = fused.forward_logprobs(make_batch(PROMPTS, RESPONSES), 1.0, MicroSpec(size=6))
    with plain.adapters_disabled():
        lp_plain, _ = plain.forward_logprobs(make_batch(PROMPTS, RESPONSES), 1.0, MicroSpec(size=6))
    torch.testing.assert_close(lp_fused, lp_plain, atol=1e-5, rtol=0)


def test_default_is_plain_on_cpu_and_value_models_ignore_it(
    tiny_model_dir: Path, value_model_dir: Path
) -> None:
    assert not TrainingEngine(EngineSpec(str(tiny_model_dir), ModelKind.CAUSAL_LM, Dtype.FLOAT32)).fused_head
    value = TrainingEngine(EngineSpec(str(value_model_dir), ModelKind.VALUE, Dtype.FLOAT32, fused_head=True))
    assert not value.fused_head
    values = value.forward_values(make_batch(PROMPTS, RESPONSES), MicroSpec(size=6))
    assert values.shape == (len(PROMPTS), max(RESPONSES))
