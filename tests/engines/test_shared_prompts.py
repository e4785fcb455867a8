"""Rows sharing their prompt run it once (`model.shared_prompts`, `engines.shared_prompts`): the same
log-probs, entropy, values and gradients as each row run alone (float32, within 1e-5), on GRPO-like
micro-batches (groups of unequal size, out of order, a row with an empty response), and fewer tokens
through the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, pg_loss, reference_logprobs, surrogate_grads

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.inputs import build_inputs
from quartet.engines.packing import pack_inputs, pack_sharing
from quartet.engines.shared_prompts import AttentionSpans, masked_span, span_attention
from quartet.models.loading import load_causal_lm

# row -> its prompt (0..3): groups of 3, 2, 1 and 2 rows, interleaved; row 6 has an empty response
GROUP_OF = [0, 1, 0, 2, 1, 0, 3, 3]
PROMPT_LENS = [5, 9, 3, 12]
RESPONSES = [4, 7, 11, 6, 1, 9, 0, 5]


def grpo_batch(seed: int) -> Batch:
    """Rows whose prompts repeat as `GROUP_OF` says (same tokens, same left padding), random responses."""
    batch = make_batch(
        [PROMPT_LENS[g] for g in GROUP_OF], RESPONSES, prompt_width=14, response_width=13, seed=seed
    )
    leader = {g: GROUP_OF.index(g) for g in set(GROUP_OF)}
    prompts = batch["prompts"]
    for row, g in enumerate(GROUP_OF):
        prompts[row] = prompts[leader[g]]
    return batch


def _engine(model_dir: Path, share: bool, kind: ModelKind = ModelKind.CAUSAL_LM) -> TrainingEngine:
    spec = EngineSpec(
        str(model_dir),
        kind,
        Dtype.FLOAT32,
        optim=OptimConfig(lr=1e-3),
        remove_padding=True,
        shared_prompts=share,
    )
    return TrainingEngine(spec)


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path) -> tuple[TrainingEngine, TrainingEngine]:
    return _engine(tiny_model_dir, False), _engine(tiny_model_dir, True)


def test_each_prompt_is_packed_once_and_each_response_reads_its_own_prompt() -> None:
    batch = grpo_batch(seed=1)
    inputs = build_inputs(batch)
    shared = pack_sharing(inputs)
    assert shared is not None and shared.spans is not None
    whole = pack_inputs(inputs)
    expected = sum(PROMPT_LENS) + sum(RESPONSES)
    assert shared.input_ids.shape[1] == expected < whole.input_ids.shape[1]
    assert torch.equal(shared.targets, whole.targets)  # the same tokens scored, row-major
    tokens, positions = shared.input_ids[0], shared.position_ids[0]
    # independently: the ids and positions each kept index points at are those `pack_inputs` points at
    assert torch.equal(tokens[shared.keep], whole.input_ids[0][whole.keep])
    assert torch.equal(positions[shared.keep], whole.position_ids[0][whole.keep])
    # spans: one per prompt, one per non-empty response; every response span's keys start with its prompt
    assert len(shared.spans.query_lengths) == len(PROMPT_LENS) + sum(1 for r in RESPONSES if r)
    assert sum(shared.spans.query_lengths) == expected


def test_no_shared_prompt_packs_each_row_whole() -> None:
    batch = make_batch([5, 9, 3], [4, 7, 2], prompt_width=10, response_width=8, seed=2)
    assert pack_sharing(build_inputs(batch)) is None


@pytest.mark.parametrize(("window", "with_sinks"), [(None, False), (3, False), (None, True), (4, True)])
def test_span_attention_equals_each_row_alone(window: int | None, with_sinks: bool) -> None:
    """A prompt of 5 and responses of 4 and 2 (GQA: 4 query heads over 2 key/value heads)."""
    g = torch.Generator().manual_seed(0)
    prompt, answers = 5, [4, 2]
    n = prompt + sum(answers)
    q, k, v = (torch.randn(1, h, n, 8, generator=g) for h in (4, 2, 2))
    sinks = torch.randn(4, generator=g) if with_sinks else None
    keys = [
        torch.arange(prompt),
        torch.cat([torch.arange(5), torch.arange(5, 9)]),
        torch.cat([torch.arange(5), torch.arange(9, 11)]),
    ]
    spans = AttentionSpans((prompt, *answers), torch.cat(keys), tuple(len(x) for x in keys))
    out = span_attention(q, k, v, None, spans, window, sinks)  # [1, N, Hq, D]
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    starts = [0, 5, 9]
    for start, length, index in zip(starts, (prompt, *answers), keys, strict=True):
        row = masked_span(q[:, :, index], kr[:, :, index], vr[:, :, index], 8**-0.5, window, sinks)  # alone
        torch.testing.assert_close(out[0, start : start + length], row[0, :, -length:].transpose(0, 1))


def _tokens_through(engine: TrainingEngine) -> list[int]:
    seen: list[int] = []
    embed = engine.module.get_input_embeddings()
    embed.register_forward_hook(lambda _m, args, _o: seen.append(int(args[0].numel())))
    return seen


@pytest.mark.parametrize("micro", [MicroSpec(size=8), MicroSpec(size=3), MicroSpec(max_tokens=40)])
def test_shared_logprobs_equal_each_row_alone(
    engines: tuple[TrainingEngine, TrainingEngine], tiny_model_dir: Path, micro: MicroSpec
) -> None:
    whole, shared = engines
    batch = grpo_batch(seed=3)
    lp_whole, ent_whole = whole.forward_logprobs(batch, 0.8, micro, with_entropy=True)
    lp_shared, ent_shared = shared.forward_logprobs(batch, 0.8, micro, with_entropy=True)
    assert ent_whole is not None and ent_shared is not None
    with torch.no_grad():
        ref_lp, ref_ent = reference_logprobs(load_causal_lm(tiny_model_dir), batch, 0.8)
    torch.testing.assert_close(lp_shared, ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_shared, ref_ent, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp_shared, lp_whole, atol=1e-5, rtol=0)
    assert (lp_shared[batch["response_mask"] == 0] == 0).all()


def test_the_shared_pass_runs_fewer_tokens(tiny_model_dir: Path) -> None:
    counts = {}
    for share in (False, True):
        engine = _engine(tiny_model_dir, share)
        seen = _tokens_through(engine)
        engine.forward_logprobs(grpo_batch(seed=4), 1.0, MicroSpec(size=8))
        counts[share] = sum(seen)
    prompts_once = sum(PROMPT_LENS) + sum(RESPONSES)
    every_row = sum(PROMPT_LENS[g] for g in GROUP_OF) + sum(RESPONSES)
    assert counts == {False: every_row, True: prompts_once}


def test_shared_gradients_equal_the_unshared_ones(engines: tuple[TrainingEngine, TrainingEngine]) -> None:
    whole, shared = engines
    g_whole, g_shared = (surrogate_grads(e, grpo_batch(seed=5), 0.7) for e in (whole, shared))
    assert g_whole.keys() == g_shared.keys() and len(g_whole) > 10
    for name in g_whole:
        scale = max(1.0, float(g_whole[name].abs().max()))
        torch.testing.assert_close(g_shared[name], g_whole[name], atol=1e-5 * scale, rtol=1e-4, msg=name)


def test_a_shared_train_step_matches_the_unshared_one(tiny_model_dir: Path) -> None:
    batch = grpo_batch(seed=7)
    results = [
        _engine(tiny_model_dir, share).train_step(batch, pg_loss, MicroSpec(size=4), temperature=1.0)
        for share in (False, True)
    ]
    assert results[1]["loss"] == pytest.approx(results[0]["loss"], abs=1e-6)
    assert results[1]["grad_norm"] == pytest.approx(results[0]["grad_norm"], rel=1e-5)


def test_shared_values_equal_the_unshared_ones(value_model_dir: Path) -> None:
    batch = grpo_batch(seed=8)
    whole, shared = (_engine(value_model_dir, s, ModelKind.VALUE) for s in (False, True))
    seen = _tokens_through(shared)
    expected = whole.forward_values(batch, MicroSpec(size=8))
    torch.testing.assert_close(shared.forward_values(batch, MicroSpec(size=8)), expected, atol=1e-5, rtol=0)
    assert seen == [sum(PROMPT_LENS) + sum(RESPONSES)]
