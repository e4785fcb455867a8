"""The bucketed decode step (what a CUDA graph replays) equals the eager step, on the CPU.

The graph capture itself needs a GPU (tests/rollout/test_graph_decode_gpu.py); everything a graph depends
on (padded rows in free slots, masked extra columns, buckets, dropping buffers when the cache moves) runs
here eagerly at the same shapes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollout_cases import hf_greedy, prompt_ids, recompute_logprobs, shared_model, tokenizer

from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.torch.graph_decode import BucketedDecoder, row_buckets
from quartet.rollout.torch.model_runner import DecoderRunner
from quartet.rollout.torch.sampling import RowSampling, sample_next


def test_row_buckets_are_powers_of_two_capped_at_the_slots() -> None:
    assert row_buckets(1) == (1,)
    assert row_buckets(5) == (1, 2, 4, 5)
    assert row_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    with pytest.raises(ValueError, match="num_slots"):
        row_buckets(0)


def test_shapes_round_rows_up_and_lengths_to_the_quantum_within_capacity(tiny_model_dir: Path) -> None:
    runner = DecoderRunner(shared_model(tiny_model_dir))
    dec = BucketedDecoder(runner, 6, capture=False, length_quantum=8)
    assert dec.shape(3, 5, capacity=64) == (4, 8)
    assert dec.shape(5, 9, capacity=64) == (6, 16)
    assert dec.shape(1, 57, capacity=60) == (1, 60)  # never past the cache's columns
    with pytest.raises(ValueError, match="rows"):
        dec.shape(7, 5, capacity=64)
    with pytest.raises(ValueError, match="capacity"):
        dec.shape(2, 65, capacity=64)


def _prefilled(runner: DecoderRunner, prompts: list[list[int]], slots: int) -> tuple[object, torch.Tensor]:
    cache = runner.new_cache(slots)
    cache.ensure_capacity(64, used=0)
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in prompts])
    logits = runner.prefill(ids, lengths, cache, 0, None)
    return cache, logits


@torch.inference_mode()
def test_bucketed_steps_equal_eager_steps_and_touch_only_free_slots(tiny_model_dir: Path) -> None:
    runner = DecoderRunner(shared_model(tiny_model_dir))
    prompts = prompt_ids(tiny_model_dir)[:3]
    eager_cache, logits = _prefilled(runner, prompts, slots=6)
    bucket_cache, _ = _prefilled(runner, prompts, slots=6)
    dec = BucketedDecoder(runner, 6, capture=False, length_quantum=8)
    lengths = torch.tensor([len(p) for p in prompts])
    tokens = logits.argmax(-1)
    for _ in range(12):  # lengths cross several 8-column buckets
        longest = int(lengths.max()) + 1
        want = runner.decode(tokens, lengths, longest, eager_cache)  # type: ignore[arg-type]
        got = dec.decode(tokens, lengths, longest, bucket_cache)  # type: ignore[arg-type]
        assert got.shape == want.shape == (3, runner.vocab_size)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        tokens, lengths = want.argmax(-1), lengths + 1
    assert {shape[0] for shape in dec.shapes} == {4} and len(dec.shapes) >= 2
    end = int(lengths.max())
    for layer in range(len(runner.layers)):
        keys_e, keys_b = eager_cache.keys[layer], bucket_cache.keys[layer]  # type: ignore[attr-defined]
        vals_e, vals_b = eager_cache.values[layer], bucket_cache.values[layer]  # type: ignore[attr-defined]
        torch.testing.assert_close(keys_b[:3, ..., :end], keys_e[:3, ..., :end], atol=1e-5, rtol=0)
        torch.testing.assert_close(vals_b[:3, :, :end], vals_e[:3, :, :end], atol=1e-5, rtol=0)
        # the padded row (slot 3) wrote only column 0 of a free slot; slots 4 and 5 are untouched
        assert keys_b[3, ..., 0].abs().sum() > 0 and not keys_b[3, ..., 1:].any()
        assert not keys_b[4:].any() and not vals_b[4:].any()


@torch.inference_mode()
def test_buffers_are_dropped_when_the_cache_moves(tiny_model_dir: Path) -> None:
    runner = DecoderRunner(shared_model(tiny_model_dir))
    prompts = prompt_ids(tiny_model_dir)[:2]
    cache, logits = _prefilled(runner, prompts, slots=4)
    dec = BucketedDecoder(runner, 4, capture=False, length_quantum=8)
    lengths = torch.tensor([len(p) for p in prompts])
    dec.decode(logits.argmax(-1), lengths, int(lengths.max()) + 1, cache)  # type: ignore[arg-type]
    assert len(dec.shapes) == 1
    cache.ensure_capacity(200, used=int(lengths.max()) + 1)  # type: ignore[attr-defined]  # new tensors
    dec.decode(logits.argmax(-1), lengths + 1, int(lengths.max()) + 2, cache)  # type: ignore[arg-type]
    assert len(dec.shapes) == 1  # the old bucket went with the old cache
    dec.reset()
    assert dec.shapes == []


def test_an_engine_decoding_at_buckets_generates_what_transformers_does(tiny_model_dir: Path) -> None:
    """Continuous batching with rows finishing at different steps (compaction), prompts queueing."""
    model = shared_model(tiny_model_dir)
    prompts = prompt_ids(tiny_model_dir)
    budgets = [24, 5, 17, 9, 24]
    expected = hf_greedy(model, prompts, max(budgets), tokenizer(tiny_model_dir).pad_token_id)
    with TorchRolloutEngine(model, max_num_seqs=3) as eng:
        eng.core.decoder = BucketedDecoder(eng.runner, 3, capture=False, length_quantum=8)
        outs = eng.generate(
            [
                GenerationRequest(
                    tuple(p), SamplingParams(temperature=0.0, max_new_tokens=b, ignore_eos=True)
                )
                for p, b in zip(prompts, budgets, strict=True)
            ]
        )
        shapes = eng.core.decoder.shapes
    assert [list(o[0].token_ids) for o in outs] == [e[:b] for e, b in zip(expected, budgets, strict=True)]
    assert {rows for rows, _ in shapes} <= {1, 2, 3} and len(shapes) > 1
    sampled = outs[0][0]
    want = recompute_logprobs(model, prompts[0], list(sampled.token_ids), 1.0)
    torch.testing.assert_close(torch.tensor(sampled.logprobs), want, atol=1e-4, rtol=0)


def test_a_cpu_engine_builds_no_graph_decoder(tiny_model_dir: Path) -> None:
    with TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=2, cuda_graphs=True) as eng:
        assert eng.core.decoder is None  # graphs need CUDA; the CPU engine stays eager


def _row_sampling(temps: list[float], ks: list[int], ps: list[float]) -> RowSampling:
    return RowSampling(
        temperature=torch.tensor(temps, dtype=torch.float32),
        top_k=torch.tensor(ks, dtype=torch.long),
        top_p=torch.tensor(ps, dtype=torch.float32),
        any_filter=any(k > 0 for k in ks) or any(p < 1.0 for p in ps),
        any_greedy=any(t == 0.0 for t in temps),
        all_greedy=all(t == 0.0 for t in temps),
    )


SAMPLINGS = {
    "greedy": ([0.0, 0.0, 0.0], [0, 0, 0], [1.0, 1.0, 1.0]),
    "temperature, one greedy row": ([0.7, 0.0, 1.3], [0, 0, 0], [1.0, 1.0, 1.0]),
    "top-k and top-p": ([1.0, 0.9, 1.1], [5, 0, 40], [1.0, 0.8, 0.95]),
}


@pytest.mark.parametrize("case", list(SAMPLINGS))
@torch.inference_mode()
def test_sampling_inside_the_step_equals_sampling_its_logits(tiny_model_dir: Path, case: str) -> None:
    """3 rows at a bucket of 4: the padded row samples as row 0 and is dropped; every real row's token and
    log-prob equal `sample_next` on the logits the step computes, bit for bit."""
    runner = DecoderRunner(shared_model(tiny_model_dir))
    prompts = prompt_ids(tiny_model_dir)[:3]
    logits_cache, logits = _prefilled(runner, prompts, slots=6)
    sampled_cache, _ = _prefilled(runner, prompts, slots=6)
    of_logits = BucketedDecoder(runner, 6, capture=False, length_quantum=8)
    inside = BucketedDecoder(runner, 6, capture=False, length_quantum=8)
    rows = _row_sampling(*SAMPLINGS[case])
    generator = torch.Generator().manual_seed(7)
    lengths = torch.tensor([len(p) for p in prompts])
    tokens = logits.argmax(-1)
    for _ in range(10):
        longest = int(lengths.max()) + 1
        uniforms = torch.rand(3, generator=generator)
        step_logits = of_logits.decode(tokens, lengths, longest, logits_cache)  # type: ignore[arg-type]
        want_tokens, want_logprobs = sample_next(step_logits, rows, uniforms)
        got_tokens, got_logprobs = inside.decode_sampled(
            tokens,
            lengths,
            longest,
            sampled_cache,  # type: ignore[arg-type]
            rows,
            uniforms,
            sample_next,
        )
        assert torch.equal(got_tokens, want_tokens)
        assert want_logprobs is not None and torch.equal(got_logprobs, want_logprobs)
        tokens, lengths = want_tokens, lengths + 1
    assert {rows for rows, _ in inside.shapes} == {4}
    flags = (rows.any_filter, rows.any_greedy, rows.all_greedy)
    assert all(key[2:] == (*flags, 1) for key in inside._buckets)  # keyed by the sampler's host flags


def _mixed_requests(prompts: list[list[int]], last_budget: int = 20) -> list[GenerationRequest]:
    """Seeded sampling with and without filters, a greedy row, and one row that asks for top log-probs
    (its batches keep the sampler outside the step while it runs)."""
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=20, seed=3, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=6, seed=4, ignore_eos=True),
        SamplingParams(temperature=0.0, max_new_tokens=14, ignore_eos=True),
        SamplingParams(temperature=1.2, max_new_tokens=9, seed=5, ignore_eos=True, top_logprobs=2),
        SamplingParams(temperature=1.0, max_new_tokens=last_budget, seed=6, ignore_eos=True),
    ]
    return [GenerationRequest(tuple(p), s) for p, s in zip(prompts, params, strict=True)]


def test_an_engine_samples_the_same_inside_the_step_as_after_it(tiny_model_dir: Path) -> None:
    model = shared_model(tiny_model_dir)
    prompts = prompt_ids(tiny_model_dir)
    results = []
    for inside in (False, True):
        with TorchRolloutEngine(model, max_num_seqs=3) as eng:
            eng.core.decoder = BucketedDecoder(eng.runner, 3, capture=False, sample_inside=inside)
            outs = eng.generate(_mixed_requests(prompts))
            results.append([(list(o[0].token_ids), torch.tensor(o[0].logprobs)) for o in outs])
            sampled_buckets = [key for key in eng.core.decoder._buckets if len(key) > 2]
            assert bool(sampled_buckets) == inside  # the plain batches sampled inside the step
    for (after_tokens, after_logprobs), (inside_tokens, inside_logprobs) in zip(*results, strict=True):
        assert inside_tokens == after_tokens
        # the same arithmetic, on [bucket, V] instead of [rows, V]: within float32 rounding
        torch.testing.assert_close(inside_logprobs, after_logprobs, atol=1e-5, rtol=0)


@torch.inference_mode()
def test_several_steps_in_one_call_equal_one_step_at_a_time(tiny_model_dir: Path) -> None:
    """`decode_steps` feeds each sampled token to the next step on the device: its K tokens and log-probs
    equal K successive `decode_sampled` calls (the attended length is one bucket for all K)."""
    runner = DecoderRunner(shared_model(tiny_model_dir))
    prompts = prompt_ids(tiny_model_dir)[:3]
    one_cache, logits = _prefilled(runner, prompts, slots=4)
    block_cache, _ = _prefilled(runner, prompts, slots=4)
    one = BucketedDecoder(runner, 4, capture=False, length_quantum=8)
    block = BucketedDecoder(runner, 4, capture=False, length_quantum=8, steps_per_replay=3)
    rows = _row_sampling(*SAMPLINGS["top-k and top-p"])
    uniforms = torch.rand(3, 3, generator=torch.Generator().manual_seed(3))
    lengths = torch.tensor([len(p) for p in prompts])
    tokens = logits.argmax(-1)
    got_tokens, got_logprobs = block.decode_steps(
        tokens,
        lengths,
        int(lengths.max()) + 1,
        block_cache,
        rows,
        uniforms,
        sample_next,  # type: ignore[arg-type]
    )
    assert got_tokens.shape == got_logprobs.shape == (3, 3)
    for j in range(3):
        want_tokens, want_logprobs = one.decode_sampled(
            tokens,
            lengths,
            int(lengths.max()) + 1,
            one_cache,
            rows,
            uniforms[:, j],
            sample_next,  # type: ignore[arg-type]
        )
        assert torch.equal(got_tokens[:, j], want_tokens)
        torch.testing.assert_close(got_logprobs[:, j], want_logprobs, atol=1e-6, rtol=0)
        tokens, lengths = want_tokens, lengths + 1
    end = int(lengths.max())
    for layer in range(len(runner.layers)):  # the same cache columns written
        torch.testing.assert_close(
            block_cache.keys[layer][:3, ..., :end],  # type: ignore[attr-defined]
            one_cache.keys[layer][:3, ..., :end],  # type: ignore[attr-defined]
            atol=1e-5,
            rtol=0,
        )


def test_an_engine_decoding_blocks_of_tokens_generates_what_one_at_a_time_does(tiny_model_dir: Path) -> None:
    """Blocks of 5 tokens a step: budgets that end inside a block, a row whose top log-probs keep its batch
    on single steps while it runs, queued requests, and a cache too short for a last whole block (the last
    prompt's 16 tokens and 48 new ones fill a cache of 64 columns; its blocks start at tokens 1, 6, ..., 46,
    and the last 2 go one at a time)."""
    model = shared_model(tiny_model_dir)
    prompts = prompt_ids(tiny_model_dir)
    assert len(prompts[-1]) == 16
    results = []
    for steps in (1, 5):
        with TorchRolloutEngine(model, max_num_seqs=3) as eng:
            eng.core.decoder = BucketedDecoder(eng.runner, 3, capture=False, steps_per_replay=steps)
            outs = eng.generate(_mixed_requests(prompts, last_budget=48))
            assert eng.core.cache.capacity == 64
            results.append([(list(o[0].token_ids), torch.tensor(o[0].logprobs)) for o in outs])
            blocks = [key for key in eng.core.decoder._buckets if key[-1] == 5]
            assert bool(blocks) == (steps == 5)  # the plain batches decoded in blocks
    for (one_tokens, one_logprobs), (block_tokens, block_logprobs) in zip(*results, strict=True):
        assert block_tokens == one_tokens
        torch.testing.assert_close(block_logprobs, one_logprobs, atol=1e-5, rtol=0)
    assert [len(tokens) for tokens, _ in results[1]] == [20, 6, 14, 9, 48]  # every budget, none past it


def test_the_steps_per_replay_are_checked(tiny_model_dir: Path) -> None:
    from quartet.config import ConfigError
    from quartet.config.rollout import RolloutConfig

    with pytest.raises(ConfigError, match="graph_decode_steps"):
        RolloutConfig(graph_decode_steps=0)
    assert RolloutConfig().graph_decode_steps == 1
    with pytest.raises(ValueError, match="steps_per_replay"):
        BucketedDecoder(DecoderRunner(shared_model(tiny_model_dir)), 2, capture=False, steps_per_replay=0)
