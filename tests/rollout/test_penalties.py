"""Penalties, min_tokens and top log-probs against logits penalised by hand, one token at a time."""

from __future__ import annotations

import math

import pytest
import torch
from rollout_cases import slow_penalised

from quartet.rollout import GenerationRequest, SamplingParams
from quartet.rollout.torch.penalties import apply_processing, build_processing
from quartet.rollout.torch.sampling import top_logprobs
from quartet.rollout.torch.sequence import SequenceState

VOCAB = 12


def seq(
    prompt: list[int], generated: list[int], stop_ids: set[int] | None = None, **kw: object
) -> SequenceState:
    request = GenerationRequest(tuple(prompt), SamplingParams(max_new_tokens=20, **kw))  # type: ignore[arg-type]
    state = SequenceState(request, 0, 0, 20, frozenset(stop_ids or ()))
    state.token_ids.extend(generated)
    return state


def by_hand(logits: list[float], state: SequenceState) -> list[float]:
    return slow_penalised(
        logits, state.request.prompt_token_ids, state.token_ids, state.request.sampling, state.stop_ids
    )


def test_penalties_match_a_token_by_token_computation() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, VOCAB, generator=gen) * 3
    rows = [
        seq([1, 2, 3], [4, 4, 5], presence_penalty=0.7),
        seq([1, 2, 3], [4, 4, 5, 4], frequency_penalty=0.4),
        seq([1, 2, 3, 9], [0, 4, 4], repetition_penalty=1.7),
        seq([7], [7, 8, 8, 8], repetition_penalty=0.6, presence_penalty=-0.5, frequency_penalty=1.5),
        seq([1, 2], [3], stop_ids={0, 6, 99}, min_tokens=2),  # 99 lies outside the vocabulary: ignored
    ]
    proc = build_processing(rows, VOCAB, torch.device("cpu"))
    assert proc is not None
    got = apply_processing(logits, proc)
    expected = torch.tensor([by_hand(logits[i].tolist(), r) for i, r in enumerate(rows)])
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert got[4, 0] == -math.inf and got[4, 6] == -math.inf and torch.isfinite(got[4, 1:6]).all()


def test_rows_without_penalties_keep_their_logits_exactly() -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    rows = [seq([1, 2], [3, 3]), seq([1, 2], [3, 3], frequency_penalty=1.0), seq([5], [5, 1])]
    proc = build_processing(rows, VOCAB, torch.device("cpu"))
    assert proc is not None
    got = apply_processing(logits, proc)
    assert torch.equal(got[0], logits[0]) and torch.equal(got[2], logits[2])
    assert not torch.equal(got[1], logits[1])
    assert build_processing([rows[0], rows[2]], VOCAB, torch.device("cpu")) is None  # nothing to do


def test_min_tokens_lifts_the_mask_once_reached() -> None:
    under, reached = seq([1], [2], stop_ids={3}, min_tokens=2), seq([1], [2, 2], stop_ids={3}, min_tokens=2)
    proc = build_processing([under, reached], VOCAB, torch.device("cpu"))
    assert proc is not None
    got = apply_processing(torch.zeros(2, VOCAB), proc)
    assert got[0, 3] == -math.inf and got[1, 3] == 0.0


def test_top_logprobs_follow_the_scaled_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 1.0, 2.0]])
    values, ids = top_logprobs(logits, torch.tensor([0.5, 0.0]), 2)
    for row, temp in ((0, 0.5), (1, 1.0)):  # greedy rows are reported at T = 1
        scaled = [x / temp for x in logits[row].tolist()]
        norm = math.log(sum(math.exp(x) for x in scaled))
        ranked = sorted(range(4), key=lambda v: -scaled[v])[:2]
        assert ids[row].tolist() == ranked
        assert values[row].tolist() == pytest.approx([scaled[v] - norm for v in ranked], abs=1e-6)
