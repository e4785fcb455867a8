"""The built-in engine's penalties, min_tokens and top log-probs against a slow reference decoding loop.

The reference runs the transformers model on prompt + response for every token and penalises its logits
in a Python loop over the vocabulary (`rollout_cases.slow_penalised`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rollout_cases import prompt_ids, recompute_logits, shared_model, slow_log_softmax, slow_penalised

from quartet.rollout import FinishReason, GenerationRequest, SamplingParams, TorchRolloutEngine

PENALTIES = {"repetition_penalty": 1.4, "frequency_penalty": 0.6, "presence_penalty": 0.4}


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[TorchRolloutEngine]:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=8)
    yield eng
    eng.shutdown()


def next_logits(tiny_model_dir: Path, prompt: list[int], generated: list[int]) -> list[float]:
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        return shared_model(tiny_model_dir)(input_ids=ids).logits[0, -1].float().tolist()  # type: ignore[no-any-return]


def slow_greedy(
    tiny_model_dir: Path, prompt: list[int], params: SamplingParams, stop_ids: frozenset[int] = frozenset()
) -> tuple[list[int], list[float]]:
    """Greedy decoding of penalised logits, one full forward per token; log-probs at T = 1."""
    tokens: list[int] = []
    logprobs: list[float] = []
    while len(tokens) < params.max_new_tokens:
        logits = slow_penalised(next_logits(tiny_model_dir, prompt, tokens), prompt, tokens, params, stop_ids)
        best = max(range(len(logits)), key=lambda v: logits[v])
        tokens.append(best)
        logprobs.append(slow_log_softmax(logits)[best])
        if best in stop_ids and len(tokens) >= params.min_tokens:
            break
    return tokens, logprobs


def test_greedy_penalised_decoding_matches_the_slow_loop(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = prompt_ids(tiny_model_dir)[0]
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True, **PENALTIES)  # type: ignore[arg-type]
    plain = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    alone = engine.generate([GenerationRequest(tuple(prompt), plain)])[0][0]
    # the penalised request shares its batch with a plain one, which must not notice
    penalised, beside = (
        o[0] for o in engine.generate([GenerationRequest(tuple(prompt), p) for p in (params, plain)])
    )
    tokens, logprobs = slow_greedy(tiny_model_dir, prompt, params)
    assert list(penalised.token_ids) == tokens
    assert penalised.logprobs is not None
    torch.testing.assert_close(torch.tensor(penalised.logprobs), torch.tensor(logprobs), atol=1e-4, rtol=0)
    assert beside.token_ids == alone.token_ids  # log-probs equal up to the numerics of another batch shape
    torch.testing.assert_close(torch.tensor(beside.logprobs), torch.tensor(alone.logprobs), atol=1e-5, rtol=0)
    assert penalised.token_ids != alone.token_ids  # the penalties changed the output


def test_sampled_logprobs_are_those_of_the_penalised_distribution(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = prompt_ids(tiny_model_dir)[2]
    temp = 0.8
    params = SamplingParams(temperature=temp, max_new_tokens=10, n=2, seed=3, ignore_eos=True, **PENALTIES)  # type: ignore[arg-type]
    for out in engine.generate([GenerationRequest(tuple(prompt), params)])[0]:
        response = list(out.token_ids)
        expected = []
        for i, token in enumerate(response):
            logits = slow_penalised(
                next_logits(tiny_model_dir, prompt, response[:i]), prompt, response[:i], params, set()
            )
            expected.append(slow_log_softmax([x / temp for x in logits])[token])
        assert out.logprobs is not None
        torch.testing.assert_close(torch.tensor(out.logprobs), torch.tensor(expected), atol=1e-4, rtol=0)


def test_min_tokens_holds_back_the_stop_ids(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    prompt = prompt_ids(tiny_model_dir)[1]
    free = engine.generate(
        [GenerationRequest(tuple(prompt), SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True))]
    )
    stop = free[0][0].token_ids[0]
    early = SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True, stop_token_ids=(stop,))
    held = SamplingParams(
        temperature=0, max_new_tokens=8, ignore_eos=True, stop_token_ids=(stop,), min_tokens=3
    )
    first, later = (
        o[0] for o in engine.generate([GenerationRequest(tuple(prompt), p) for p in (early, held)])
    )
    assert first.token_ids == (stop,) and first.finish_reason is FinishReason.STOP
    tokens, _ = slow_greedy(tiny_model_dir, prompt, held, frozenset({stop}))
    assert list(later.token_ids) == tokens
    assert stop not in later.token_ids[:3] and len(later.token_ids) > 3


def test_top_logprobs_are_the_most_likely_tokens_of_the_sampled_distribution(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    model = shared_model(tiny_model_dir)
    prompt = prompt_ids(tiny_model_dir)[3]
    for temp in (0.0, 0.7):
        params = SamplingParams(temperature=temp, max_new_tokens=6, seed=1, ignore_eos=True, top_logprobs=4)
        out = engine.generate([GenerationRequest(tuple(prompt), params)])[0][0]
        assert out.top_logprobs is not None and len(out.top_logprobs) == len(out.token_ids)
        scaled = recompute_logits(model, prompt, list(out.token_ids)) / (temp or 1.0)
        ref_values, ref_ids = torch.log_softmax(scaled, dim=-1).topk(4, dim=-1)
        for pos, entries in enumerate(out.top_logprobs):
            assert [t for t, _ in entries] == ref_ids[pos].tolist()
            torch.testing.assert_close(
                torch.tensor([v for _, v in entries]), ref_values[pos], atol=1e-4, rtol=0
            )
        if temp == 0.0:  # greedy: the chosen token is the most likely one, with the same log-prob
            assert out.logprobs is not None
            assert [e[0][0] for e in out.top_logprobs] == list(out.token_ids)
            assert [e[0][1] for e in out.top_logprobs] == pytest.approx(out.logprobs, abs=1e-6)
    plain = engine.generate([GenerationRequest(tuple(prompt), SamplingParams(max_new_tokens=2))])[0][0]
    assert plain.top_logprobs is None
