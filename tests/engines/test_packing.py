"""Packed micro-batches (`model.remove_padding`) against the padded path and a per-row reference: equal
log-probs, entropy and gradients (float32, within 1e-5), on rows padded on both sides with junk tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, reference_logprobs

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.inputs import build_inputs
from quartet.engines.packing import pack_inputs
from quartet.models.loading import load_causal_lm

PROMPTS = [5, 9, 3, 12, 1, 7]
RESPONSES = [4, 1, 11, 6, 9, 2]


def _engine(model_dir: Path, packed: bool) -> TrainingEngine:
    spec = EngineSpec(
        str(model_dir),
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OptimConfig(lr=1e-3),
        remove_padding=packed,
    )
    return TrainingEngine(spec)


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> tuple[TrainingEngine, TrainingEngine]:
    return _engine(tiny_model_dir, False), _engine(tiny_model_dir, True)


def test_pack_keeps_real_tokens_and_finds_the_predicting_positions() -> None:
    batch = make_batch([2, 3], [2, 1], prompt_width=4, response_width=3)
    inputs = build_inputs(batch)
    packed = pack_inputs(inputs)
    mask = batch["attention_mask"] != 0
    ids = torch.cat([batch["prompts"], batch["responses"]], 1)
    assert packed.input_ids.tolist() == [ids[0][mask[0]].tolist() + ids[1][mask[1]].tolist()]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert packed.bounds == (0, 4, 8)
    # row 0 = p p r r: response tokens at packed 2, 3 are predicted from 1, 2; row 1 = p p p r: 7 from 6
    assert packed.keep.tolist() == [1, 2, 6]
    assert packed.targets.tolist() == [
        ids[0][mask[0]][2].item(),
        ids[0][mask[0]][3].item(),
        ids[1][mask[1]][3].item(),
    ]


@pytest.mark.parametrize("micro", [MicroSpec(size=6), MicroSpec(size=4), MicroSpec(max_tokens=24)])
def test_packed_logprobs_and_entropy_equal_the_padded_path(
    engines: tuple[TrainingEngine, TrainingEngine], tiny_model_dir: Path, micro: MicroSpec
) -> None:
    padded, packed = engines
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=14, response_width=13, seed=3)
    lp_pad, ent_pad = padded.forward_logprobs(batch, 1.0, micro, with_entropy=True)
    lp_pack, ent_pack = packed.forward_logprobs(batch, 1.0, micro, with_entropy=True)
    assert ent_pad is not None and ent_pack is not None
    torch.testing.assert_close(lp_pack, lp_pad, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_pack, ent_pad, atol=1e-5, rtol=0)
    with torch.no_grad():  # row by row, no padding at all
        ref_lp, ref_ent = reference_logprobs(load_causal_lm(tiny_model_dir), batch, 1.0)
    torch.testing.assert_close(lp_pack, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_pack, ref_ent, atol=1e-5, rtol=0)
    assert (lp_pack[batch["response_mask"] == 0] == 0).all()


def _grads(engine: TrainingEngine, temperature: float) -> dict[str, torch.Tensor]:
    batch = make_batch(PROMPTS, RESPONSES, prompt_width=14, response_width=13, seed=5)
    engine.module.zero_grad(set_to_none=True)
    mb = batch
    outputs = engine._run(mb, build_inputs(mb), temperature, with_entropy=True)
    assert outputs.logprobs is not None and outputs.entropy is not None
    loss = (outputs.logprobs * batch["advantages"]).sum() + 0.1 * outputs.entropy.sum()
    loss.backward()
    out = {}
    for name, p in engine.module.named_parameters():
        grad = p.grad
        if grad is not None:
            out[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    return out


def test_packed_gradients_equal_the_padded_path(engines: tuple[TrainingEngine, TrainingEngine]) -> None:
    padded, packed = engines
    g_pad, g_pack = _grads(padded, 0.7), _grads(packed, 0.7)
    assert g_pad.keys() == g_pack.keys() and len(g_pad) > 10
    for name in g_pad:
        scale = max(1.0, float(g_pad[name].abs().max()))
        torch.testing.assert_close(g_pack[name], g_pad[name], atol=1e-5 * scale, rtol=1e-4, msg=name)


def test_a_packed_train_step_matches_the_padded_one(tiny_model_dir: Path) -> None:
    """One optimizer step each from the same start: the same loss and gradient norm. (The weights after the
    step are not compared: Adam's first step divides each gradient by its own size, so entries of ~1e-9
    amplify rounding; the gradients themselves are compared above.)"""
    from engine_cases import pg_loss

    batch = make_batch(PROMPTS, RESPONSES, prompt_width=14, response_width=13, seed=7)
    results = [
        _engine(tiny_model_dir, packed).train_step(batch, pg_loss, MicroSpec(size=3), temperature=1.0)
        for packed in (False, True)
    ]
    assert results[1]["loss"] == pytest.approx(results[0]["loss"], abs=1e-6)
    assert results[1]["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-5)
    assert results[1]["micro_batches"] == results[0]["micro_batches"] == 2
