"""Engine log-probs and entropy against an unpadded per-row transformers reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, reference_logprobs, repad

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, EngineStateError, MicroSpec, ModelKind, TrainingEngine
from quartet.models.loading import load_causal_lm

PROMPTS = [5, 2, 7, 1, 4, 6]
RESPONSES = [3, 6, 1, 4, 0, 5]  # row 4 has an empty response


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> TrainingEngine:
    return TrainingEngine(EngineSpec(str(tiny_model_dir), ModelKind.CAUSAL_LM, Dtype.FLOAT32))


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    model = load_causal_lm(tiny_model_dir).eval()
    with torch.no_grad():
        return reference_logprobs(model, make_batch(PROMPTS, RESPONSES, temperature=0.7), 0.7)


MICROS = [
    MicroSpec(size=100),
    MicroSpec(size=1),
    MicroSpec(size=4),
    MicroSpec(max_tokens=9),  # several packed micro-batches, one row alone over budget
    MicroSpec(max_tokens=10_000),
]


@pytest.mark.parametrize("micro", MICROS, ids=lambda m: f"size{m.size}-tokens{m.max_tokens}")
def test_logprobs_and_entropy_match_unpadded_reference(
    engine: TrainingEngine, reference: tuple[torch.Tensor, torch.Tensor], micro: MicroSpec
) -> None:
    batch = make_batch(PROMPTS, RESPONSES, temperature=0.7)
    logprobs, entropy = engine.forward_logprobs(batch, 0.7, micro, with_entropy=True)
    ref_lp, ref_ent = reference
    assert logprobs.shape == entropy.shape == (6, 6)  # type: ignore[union-attr]
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, ref_lp, atol=2e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_ent, atol=2e-5, rtol=0)
    assert (logprobs[4] == 0).all()  # nothing past a response's end


def test_results_do_not_depend_on_grouping_or_padding(engine: TrainingEngine) -> None:
    batch = make_batch(PROMPTS, RESPONSES, temperature=1.3)
    whole, _ = engine.forward_logprobs(batch, 1.3, MicroSpec(size=100))
    one, _ = engine.forward_logprobs(batch, 1.3, MicroSpec(size=1))
    packed, _ = engine.forward_logprobs(batch, 1.3, MicroSpec(max_tokens=9))
    padded, _ = engine.forward_logprobs(repad(batch, 3, 2), 1.3, MicroSpec(size=2))
    # Grouping changes only the floating-point reduction order (BLAS kernels pick by shape).
    torch.testing.assert_close(one, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(packed, whole, atol=1e-6, rtol=0)
    torch.testing.assert_close(padded[:, :6], whole, atol=1e-6, rtol=0)
    assert (padded[:, 6:] == 0).all()


def test_temperature_changes_the_logprobs(engine: TrainingEngine) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    hot, _ = engine.forward_logprobs(batch, 2.0, MicroSpec(size=8))
    cold, _ = engine.forward_logprobs(batch, 0.5, MicroSpec(size=8))
    assert (hot - cold).abs().max() > 0.1


def test_bf16_autocast_is_close_to_float32(tiny_model_dir: Path, engine: TrainingEngine) -> None:
    bf16 = TrainingEngine(EngineSpec(str(tiny_model_dir), ModelKind.CAUSAL_LM, Dtype.BFLOAT16))
    batch = make_batch(PROMPTS, RESPONSES)
    got, _ = bf16.forward_logprobs(batch, 1.0, MicroSpec(size=8))
    ref, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=8))
    assert got.dtype == torch.float32
    diff = (got - ref).abs().max()
    assert 0 < diff < 0.05  # bf16 rounding shows, but small


def test_wrong_kind_and_frozen_training_are_refused(engine: TrainingEngine) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    with pytest.raises(EngineStateError, match="value"):
        engine.forward_values(batch, MicroSpec())
    with pytest.raises(EngineStateError, match="frozen"):
        engine.train_step(batch, lambda o, b, s: (torch.zeros(()), {}), MicroSpec())
    with pytest.raises(EngineStateError, match="LoRA"), engine.adapters_disabled():
        pass


def test_position_ids_column_is_used_when_present(engine: TrainingEngine) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    default, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=3))
    mask = batch["attention_mask"]
    same = batch.union(Batch({"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}))
    # RoPE sees only relative positions: a constant shift changes nothing, a stretch does.
    shifted = batch.union(Batch({"position_ids": (mask.cumsum(-1) - 1).clamp(min=0) * 2}))
    assert torch.equal(engine.forward_logprobs(same, 1.0, MicroSpec(size=3))[0], default)
    assert (engine.forward_logprobs(shifted, 1.0, MicroSpec(size=3))[0] - default).abs().max() > 1e-4
