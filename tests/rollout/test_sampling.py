"""Batched sampling against distributions computed by hand."""

from __future__ import annotations

import torch

from quartet.rollout.torch.sampling import RowSampling, draw_uniforms, sample_next, sample_seed

VOCAB = 6


def rows(
    temperature: list[float], top_k: list[int] | None = None, top_p: list[float] | None = None
) -> RowSampling:
    n = len(temperature)
    k = top_k or [0] * n
    p = top_p or [1.0] * n
    return RowSampling(
        temperature=torch.tensor(temperature),
        top_k=torch.tensor(k),
        top_p=torch.tensor(p),
        any_filter=any(x > 0 for x in k) or any(x < 1 for x in p),
        any_greedy=any(t == 0 for t in temperature),
        all_greedy=all(t == 0 for t in temperature),
    )


def quantiles(count: int) -> torch.Tensor:
    """Evenly spread uniforms: token frequencies then equal the probabilities up to 1/count."""
    return (torch.arange(count, dtype=torch.float32) + 0.5) / count


def frequencies(tokens: torch.Tensor) -> torch.Tensor:
    return torch.bincount(tokens, minlength=VOCAB).float() / tokens.numel()


LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_temperature_sampling_follows_softmax_of_scaled_logits() -> None:
    count = 4000
    logits = LOGITS.expand(count, VOCAB)
    tokens, logprobs = sample_next(logits, rows([0.7] * count), quantiles(count))
    expected = torch.softmax(LOGITS / 0.7, dim=0)
    torch.testing.assert_close(frequencies(tokens), expected, atol=2 / count, rtol=0)
    assert logprobs is not None
    torch.testing.assert_close(logprobs, expected.log()[tokens])


def test_top_k_keeps_the_k_most_likely_and_reports_unfiltered_logprobs() -> None:
    count = 3000
    tokens, logprobs = sample_next(
        LOGITS.expand(count, VOCAB), rows([1.0] * count, top_k=[2] * count), quantiles(count)
    )
    p = torch.softmax(LOGITS, dim=0)
    expected = torch.zeros(VOCAB)
    expected[:2] = p[:2] / p[:2].sum()
    torch.testing.assert_close(frequencies(tokens), expected, atol=2 / count, rtol=0)
    assert logprobs is not None
    torch.testing.assert_close(logprobs, p.log()[tokens])  # log_softmax(logits / T), not the truncated one


def test_top_p_keeps_the_smallest_prefix_reaching_p() -> None:
    p = torch.softmax(LOGITS, dim=0)  # about [0.55, 0.20, 0.12, 0.07, 0.03, 0.00]
    top_p = float(p[:2].sum()) + 0.01  # needs a third token to reach it
    count = 3000
    tokens, _ = sample_next(
        LOGITS.expand(count, VOCAB), rows([1.0] * count, top_p=[top_p] * count), quantiles(count)
    )
    expected = torch.zeros(VOCAB)
    expected[:3] = p[:3] / p[:3].sum()
    torch.testing.assert_close(frequencies(tokens), expected, atol=2 / count, rtol=0)


def test_top_k_then_top_p_on_the_renormalised_distribution() -> None:
    # top-k=3 renormalises to q = p[:3]/sum; top_p just above q[0] keeps two tokens
    p = torch.softmax(LOGITS, dim=0)
    q = p[:3] / p[:3].sum()
    count = 2000
    params = rows([1.0] * count, top_k=[3] * count, top_p=[float(q[0]) + 0.01] * count)
    tokens, _ = sample_next(LOGITS.expand(count, VOCAB), params, quantiles(count))
    expected = torch.zeros(VOCAB)
    expected[:2] = q[:2] / q[:2].sum()
    torch.testing.assert_close(frequencies(tokens), expected, atol=2 / count, rtol=0)


def test_rows_mix_greedy_and_sampling_with_their_own_parameters() -> None:
    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS, LOGITS.roll(2)])
    params = rows([0.0, 0.0, 1.0, 2.0], top_k=[0, 0, 1, 0])
    uniforms = torch.tensor([0.99, 0.99, 0.99, 0.999])
    tokens, logprobs = sample_next(logits, params, uniforms)
    assert tokens[:3].tolist() == [0, 5, 0]  # greedy, greedy, top-1
    # u near 1 picks the last token of the row's CDF: in vocabulary order, as the row has no filter of its own
    assert tokens[3].item() == VOCAB - 1
    assert logprobs is not None
    expected0 = torch.log_softmax(LOGITS, 0)[0]  # greedy rows report T = 1
    expected3 = torch.log_softmax(LOGITS.roll(2) / 2.0, 0)[tokens[3]]
    torch.testing.assert_close(logprobs[[0, 3]], torch.stack([expected0, expected3]))


def test_a_rows_token_does_not_depend_on_the_other_rows_of_its_batch() -> None:
    """A seeded request samples the same tokens whoever shares its batch: a plain row beside a top-k/top-p
    row draws in its own (vocabulary) order, and a filtering row in its own (ranked) order, as each does
    alone. Before, a filtering neighbour switched the whole batch to the ranked order."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=gen) * 2
    params = [(1.0, 0, 1.0), (0.8, 5, 1.0), (1.3, 0, 0.7), (0.0, 0, 1.0)]
    batch = rows(*([list(c) for c in zip(*params, strict=True)]))  # type: ignore[arg-type]
    for u in torch.linspace(0.01, 0.99, 25):
        uniforms = torch.full((4,), float(u))
        together, _ = sample_next(logits, batch, uniforms)
        for i, (t, k, p) in enumerate(params):
            alone, _ = sample_next(logits[i : i + 1], rows([t], [k], [p]), uniforms[:1])
            assert together[i] == alone[0], (i, float(u))


def test_zero_probability_tokens_are_never_drawn() -> None:
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(100, 4)
    tokens, _ = sample_next(logits, rows([1.0] * 100), quantiles(100))
    assert set(tokens.tolist()) == {0, 2}


def test_seeds_and_uniforms_are_deterministic_and_distinct_per_sample() -> None:
    assert torch.equal(draw_uniforms(sample_seed(1, 0), 8), draw_uniforms(sample_seed(1, 0), 8))
    seeds = {sample_seed(s, j) for s in range(3) for j in range(4)}
    assert len(seeds) == 12
    u = draw_uniforms(7, 1000)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
