"""The built-in engine against transformers and against independent recomputations (tiny model, CPU, fp32)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rollout_cases import (
    hf_greedy,
    prompt_ids,
    recompute_logits,
    recompute_logprobs,
    shared_model,
    tokenizer,
    varied_model,
)

from quartet.rollout import (
    EngineStateError,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TorchRolloutEngine,
)


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[TorchRolloutEngine]:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), tokenizer(tiny_model_dir), max_num_seqs=16)
    yield eng
    eng.shutdown()


def greedy(max_new: int, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_num_seqs", [16, 2])
def test_greedy_matches_transformers_generate(tiny_model_dir: Path, max_num_seqs: int) -> None:
    model = shared_model(tiny_model_dir)
    prompts = prompt_ids(tiny_model_dir)
    assert len({len(p) for p in prompts}) == len(prompts)  # different prompt lengths
    expected = hf_greedy(model, prompts, 24, tokenizer(tiny_model_dir).pad_token_id)
    assert all(len(set(e)) > 5 for e in expected)  # outputs vary: a real comparison
    # max_num_seqs=2: requests queue and join the batch as others finish (continuous batching)
    with TorchRolloutEngine(model, max_num_seqs=max_num_seqs) as eng:
        outs = eng.generate([GenerationRequest(tuple(p), greedy(24)) for p in prompts])
    assert [list(o[0].token_ids) for o in outs] == expected
    assert all(o[0].finish_reason is FinishReason.LENGTH for o in outs)


def test_sampled_logprobs_match_recomputation(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    model = shared_model(tiny_model_dir)
    prompts = prompt_ids(tiny_model_dir)[:3]
    top_k = 20
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=0.9, max_new_tokens=20, n=3, seed=5)
    outs = engine.generate([GenerationRequest(tuple(p), params) for p in prompts])
    for prompt, samples in zip(prompts, outs, strict=True):
        assert [s.sample_index for s in samples] == [0, 1, 2]
        for s in samples:
            response = list(s.token_ids)
            assert s.logprobs is not None and len(s.logprobs) == len(response)
            ref = recompute_logprobs(model, prompt, response, 0.7)
            torch.testing.assert_close(torch.tensor(s.logprobs), ref, atol=1e-4, rtol=0)
            # every sampled token is among the top-k of the recomputed distribution
            logits = recompute_logits(model, prompt, response)
            kth = logits.topk(top_k, dim=-1).values[:, -1]
            chosen = logits.gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)
            assert bool((chosen >= kth - 1e-5).all())


def test_short_requests_finish_while_a_long_one_runs(tiny_model_dir: Path) -> None:
    prompts = prompt_ids(tiny_model_dir)
    long_req = GenerationRequest(tuple(prompts[0]), greedy(120))
    shorts = [GenerationRequest(tuple(prompts[i % len(prompts)]), greedy(12)) for i in range(9)]
    with TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=4) as eng:
        outs = eng.generate([long_req, *shorts])
    long_out = outs[0][0]
    short_outs = [o[0] for o in outs[1:]]
    assert len(long_out.token_ids) == 120
    assert all(len(o.token_ids) == 12 for o in short_outs)
    # 9 short requests through 3 free slots take ~3 rounds of 12 steps, all while the long one decodes
    assert max(o.finish_step for o in short_outs) < long_out.finish_step
    assert max(o.finish_time for o in short_outs) < long_out.finish_time
    # later shorts were admitted mid-way, into slots freed by earlier shorts (not in one static batch)
    assert max(o.first_step for o in short_outs) > 12
    assert long_out.first_step == 1


def test_stop_token_ids_end_generation_and_are_kept(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    free = engine.generate([GenerationRequest(prompt, greedy(30))])[0][0].token_ids
    stop_id = free[6]
    first = free.index(stop_id)
    out = engine.generate([GenerationRequest(prompt, greedy(30, stop_token_ids=(stop_id,)))])[0][0]
    assert out.token_ids == free[: first + 1]  # the stop token is included
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop_id
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids)


def test_eos_stops_unless_ignored(tiny_model_dir: Path) -> None:
    model = shared_model(tiny_model_dir)
    prompt = tuple(prompt_ids(tiny_model_dir)[1])
    with TorchRolloutEngine(model, max_num_seqs=4) as eng:
        free = eng.generate([GenerationRequest(prompt, greedy(30))])[0][0].token_ids
    eos = free[4]
    with TorchRolloutEngine(model, max_num_seqs=4, eos_token_ids=[eos]) as eng:
        stopped = eng.generate([GenerationRequest(prompt, SamplingParams(temperature=0, max_new_tokens=30))])
        ignored = eng.generate([GenerationRequest(prompt, greedy(30))])
    assert stopped[0][0].token_ids == free[: free.index(eos) + 1]
    assert stopped[0][0].finish_reason is FinishReason.STOP
    assert ignored[0][0].token_ids == free


def test_stop_strings_end_at_the_completing_token(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    tok = tokenizer(tiny_model_dir)
    prompt = tuple(prompt_ids(tiny_model_dir)[2])
    free = engine.generate([GenerationRequest(prompt, greedy(30))])[0][0].token_ids
    text = tok.decode(list(free[:8]), skip_special_tokens=True)
    stop = text[-3:]
    assert stop.strip(), "pick a prompt whose output has visible text"
    # the expected end: the first prefix of the response whose text contains the stop string
    end = next(k for k in range(1, 31) if stop in tok.decode(list(free[:k]), skip_special_tokens=True))
    out = engine.generate([GenerationRequest(prompt, greedy(30, stop=(stop,)))])[0][0]
    assert out.token_ids == free[:end]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop


def test_stop_strings_need_a_tokenizer(tiny_model_dir: Path) -> None:
    with (
        TorchRolloutEngine(shared_model(tiny_model_dir)) as eng,
        pytest.raises(ValueError, match="tokenizer"),
    ):
        eng.generate([GenerationRequest((1, 2, 3), greedy(5, stop=("a",)))])


def test_seeded_samples_are_reproducible_and_distinct(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])

    def run(seed: int) -> list[tuple[int, ...]]:
        params = SamplingParams(temperature=1.0, max_new_tokens=16, n=4, seed=seed, ignore_eos=True)
        return [o.token_ids for o in engine.generate([GenerationRequest(prompt, params)])[0]]

    first, again, other = run(11), run(11), run(12)
    assert first == again
    assert len(set(first)) == 4  # the n samples of one prompt differ
    assert first != other


def test_n_greedy_samples_share_the_prefill(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    prompts = prompt_ids(tiny_model_dir)[:2]
    single = engine.generate([GenerationRequest(tuple(p), greedy(12)) for p in prompts])
    multi = engine.generate([GenerationRequest(tuple(p), greedy(12, n=3)) for p in prompts])
    for one, many in zip(single, multi, strict=True):
        assert [m.token_ids for m in many] == [one[0].token_ids] * 3


def test_load_weights_changes_outputs_to_the_new_model(tiny_model_dir: Path) -> None:
    model = varied_model(tiny_model_dir)  # the engine's own copy
    perturbed = varied_model(tiny_model_dir)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in perturbed.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen) * p.std())
    assert perturbed.config.tie_word_embeddings  # the lm_head must follow embed_tokens
    prompt = prompt_ids(tiny_model_dir)[0]
    request = GenerationRequest(tuple(prompt), greedy(16))
    with TorchRolloutEngine(model) as eng:
        before = eng.generate([request])[0][0]
        count = eng.load_weights(perturbed.state_dict().items())
        after = eng.generate([request])[0][0]
    assert count == len(perturbed.state_dict())
    assert after.token_ids != before.token_ids
    assert after.logprobs is not None
    ref = recompute_logprobs(perturbed, prompt, list(after.token_ids), 1.0)
    torch.testing.assert_close(torch.tensor(after.logprobs), ref, atol=1e-4, rtol=0)
    assert torch.equal(model.lm_head.weight, perturbed.model.embed_tokens.weight)


def test_load_weights_rejects_unknown_names_and_shapes(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    with pytest.raises(KeyError, match="close"):
        engine.load_weights([("model.layers.0.self_attn.q_prj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="shape"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])
    weight = shared_model(tiny_model_dir).model.norm.weight
    assert engine.load_weights([("module.model.norm.weight", weight.detach().clone())]) == 1


def test_sleep_frees_the_cache_and_wake_restores(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    request = GenerationRequest(tuple(prompt_ids(tiny_model_dir)[0]), greedy(8))
    before = engine.generate([request])[0][0].token_ids
    assert engine.kv_cache_bytes > 0
    engine.sleep()
    assert engine.kv_cache_bytes == 0
    with pytest.raises(EngineStateError, match="asleep"):
        engine.generate([request])
    engine.wake()
    assert engine.generate([request])[0][0].token_ids == before


def test_generate_one_serves_concurrent_callers(tiny_model_dir: Path, engine: TorchRolloutEngine) -> None:
    prompts = prompt_ids(tiny_model_dir)
    expected = engine.generate([GenerationRequest(tuple(p), greedy(10)) for p in prompts])

    async def main() -> list[list[object]]:
        calls = [engine.generate_one(GenerationRequest(tuple(p), greedy(10))) for p in prompts]
        return list(await asyncio.gather(*calls))

    got = asyncio.run(main())
    assert [[o.token_ids for o in g] for g in got] == [[o.token_ids for o in e] for e in expected]  # type: ignore[attr-defined]


def test_context_limit_and_overlong_prompts(tiny_model_dir: Path) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[2])
    with TorchRolloutEngine(shared_model(tiny_model_dir), max_model_len=len(prompt) + 5) as eng:
        out = eng.generate([GenerationRequest(prompt, greedy(50))])[0][0]
        assert len(out.token_ids) == 5 and out.finish_reason is FinishReason.LENGTH
        with pytest.raises(ValueError, match="max_model_len"):
            eng.generate([GenerationRequest(prompt + prompt, greedy(5))])


def test_abort_and_shutdown_finish_requests_with_abort(tiny_model_dir: Path) -> None:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=2)
    core = eng.core  # drive the core directly: deterministic step by step
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    running = GenerationRequest(prompt, greedy(50))
    waiting = GenerationRequest(prompt, greedy(50, n=2))
    seqs = core.add(running) + core.add(waiting)
    for _ in range(3):
        core.step()
    assert [s.first_step for s in seqs] == [1, -1, -1]  # the group of 2 waits for 2 free slots
    finished = core.abort(running.request_id)
    assert [s.finish_reason for s in finished] == [FinishReason.ABORT]
    assert len(finished[0].token_ids) == 3  # what it had generated is returned
    core.step()
    assert [s.first_step for s in seqs[1:]] == [4, 4]
    eng.shutdown()
    assert all(s.finished for s in seqs)
    with pytest.raises(EngineStateError, match="shut down"):
        eng.generate([running])


def test_cache_growth_mid_run_and_requests_wider_than_the_batch(tiny_model_dir: Path) -> None:
    model = shared_model(tiny_model_dir)
    pad = tokenizer(tiny_model_dir).pad_token_id
    prompts = prompt_ids(tiny_model_dir)
    # a (30 tokens) and b (5) start together in a 64-position cache; c (100) joins when b leaves, while a
    # still runs, and needs the cache to grow without losing a's keys and values
    a = GenerationRequest(tuple(prompts[0]), greedy(30))
    b = GenerationRequest(tuple(prompts[1]), greedy(5))
    c = GenerationRequest(tuple(prompts[2]), greedy(100))
    wide = GenerationRequest(tuple(prompts[3]), greedy(6, n=5))  # 5 samples through 2 slots
    with TorchRolloutEngine(model, max_num_seqs=2) as eng:
        outs = eng.generate([a, b, c, wide])
        assert eng.core.cache.capacity >= len(prompts[2]) + 100
    assert outs[2][0].first_step > 1 and outs[2][0].first_step < outs[0][0].finish_step
    for request, out in zip([a, b, c], outs, strict=False):
        expected = hf_greedy(model, [list(request.prompt_token_ids)], request.sampling.max_new_tokens, pad)
        assert list(out[0].token_ids) == expected[0]
    single = hf_greedy(model, [prompts[3]], 6, pad)[0]
    assert [list(o.token_ids) for o in outs[3]] == [single] * 5
