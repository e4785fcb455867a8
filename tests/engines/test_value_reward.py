"""Value model (per-token values, training) and reward model (one score per sequence)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, repad, unpadded_rows, value_mse
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.inputs import build_inputs

PROMPTS = [4, 2, 6, 3]
RESPONSES = [3, 5, 1, 4]


def test_values_match_unpadded_reference_at_the_state_before_each_token(value_model_dir: Path) -> None:
    engine = TrainingEngine(EngineSpec(str(value_model_dir), ModelKind.VALUE, Dtype.FLOAT32))
    batch = make_batch(PROMPTS, RESPONSES)
    values = engine.forward_values(batch, MicroSpec(max_tokens=8))
    model = AutoModelForTokenClassification.from_pretrained(value_model_dir, local_files_only=True).eval()
    for i, (ids, pl, rl) in enumerate(unpadded_rows(batch)):
        with torch.no_grad():
            per_token = model(ids[None]).logits[0, :, 0]
        torch.testing.assert_close(values[i, :rl], per_token[pl - 1 : pl + rl - 1], atol=1e-5, rtol=0)
        assert (values[i, rl:] == 0).all()


def test_value_loss_decreases(value_model_dir: Path) -> None:
    engine = TrainingEngine(
        EngineSpec(str(value_model_dir), ModelKind.VALUE, Dtype.BFLOAT16, optim=OptimConfig(lr=1e-3))
    )
    batch = make_batch(PROMPTS, RESPONSES)
    losses = [engine.train_step(batch, value_mse, MicroSpec(size=2))["loss"] for _ in range(6)]
    assert losses[-1] < 0.7 * losses[0], losses
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses


@pytest.fixture(scope="module")
def reward_engine(reward_model_dir: Path) -> TrainingEngine:
    return TrainingEngine(EngineSpec(str(reward_model_dir), ModelKind.REWARD, Dtype.FLOAT32))


def test_reward_scores_are_the_head_at_the_last_valid_token(
    reward_engine: TrainingEngine, reward_model_dir: Path
) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    scores = reward_engine.forward_scores(batch, MicroSpec(size=3))
    assert scores.shape == (4,) and scores.dtype == torch.float32 and torch.isfinite(scores).all()
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir, local_files_only=True).eval()
    for i, (ids, _, _) in enumerate(unpadded_rows(batch)):
        with torch.no_grad():  # one unpadded row (ids never equal the pad id): transformers' own pooling
            expected = model(ids[None]).logits[0, 0]
        assert float(scores[i]) == pytest.approx(float(expected), abs=1e-5)
    assert scores.std() > 0


def test_reward_scores_ignore_padding_but_not_the_last_token(reward_engine: TrainingEngine) -> None:
    batch = make_batch(PROMPTS, RESPONSES)
    base = reward_engine.forward_scores(batch, MicroSpec(size=4))
    repadded = reward_engine.forward_scores(repad(batch, 2, 3), MicroSpec(max_tokens=7))
    torch.testing.assert_close(repadded, base, atol=1e-6, rtol=0)
    changed = batch["responses"].clone()
    changed[0, RESPONSES[0] - 1] = (changed[0, RESPONSES[0] - 1] + 1) % 500
    other = make_batch(PROMPTS, RESPONSES)
    other.tensors["responses"] = changed
    moved = reward_engine.forward_scores(other, MicroSpec(size=4))
    assert moved[0] != base[0] and torch.equal(moved[1:], base[1:])


def test_packed_values_and_gradients_equal_the_padded_path(value_model_dir: Path) -> None:
    """The value model's packed pass (what sequence parallelism runs, `engines.packed_run`): the same values
    as the per-row reference, and the same value-loss gradients as the padded path."""
    optim = OptimConfig(lr=1e-3)
    padded, packed = (
        TrainingEngine(EngineSpec(str(value_model_dir), ModelKind.VALUE, Dtype.FLOAT32, optim=optim, **kw))
        for kw in ({}, {"remove_padding": True})
    )
    assert packed.spec.packs and not padded.spec.packs
    batch = repad(make_batch(PROMPTS, RESPONSES), 2, 3)
    want = padded.forward_values(batch, MicroSpec(size=4))
    torch.testing.assert_close(packed.forward_values(batch, MicroSpec(size=3)), want, atol=1e-5, rtol=0)
    grads = []
    for engine in (padded, packed):
        out = engine._run(batch, build_inputs(batch), 1.0, False)
        loss, _ = value_mse(out, batch, LossScale(tokens=13, sequences=4, dp_size=1))
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in engine.module.named_parameters() if p.grad is not None})
    assert set(grads[0]) == set(grads[1]) and max(float(g.abs().max()) for g in grads[0].values()) > 1e-3
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-5, rtol=1e-4, msg=name)
