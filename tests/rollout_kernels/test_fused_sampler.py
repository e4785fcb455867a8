"""The fused sampler equals `sample_next`, and both equal an independent float64 computation of the draw
that `sampling.py` defines, under Triton's interpreter (see conftest.py).

Draws are kept away from cumulative-mass boundaries (by more than 1e-4 of the mass), where float32
summation order, not the definition, would decide the token.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quartet.rollout.torch.kernels import sampler
from quartet.rollout.torch.kernels.sampler import sample_fused, sample_triton
from quartet.rollout.torch.sampling import RowSampling, sample_next

MARGIN = 1e-4


def _rows(temps: list[float], ks: list[int], ps: list[float]) -> RowSampling:
    greedy = [t <= 0 for t in temps]
    return RowSampling(
        temperature=torch.tensor(temps, dtype=torch.float32),
        top_k=torch.tensor(ks, dtype=torch.int64),
        top_p=torch.tensor(ps, dtype=torch.float32),
        any_filter=any((k > 0 or p < 1) and not g for k, p, g in zip(ks, ps, greedy, strict=True)),
        any_greedy=any(greedy),
        all_greedy=all(greedy),
    )


def _expected(row: np.ndarray, temp: float, k: int, p: float, u: float, ranked: bool) -> tuple[int, float]:
    """The token `sampling.py` defines, in float64 with an explicit ranking, and the draw's distance from the
    nearest boundary it depends on (as a fraction of the mass)."""
    finite = row[np.isfinite(row)]
    if temp <= 0:
        top = np.sort(finite)[::-1]
        return int(np.argmax(row)), float(top[0] - top[1]) if len(top) > 1 else 1.0
    scaled = (row.astype(np.float32) / np.float32(temp)).astype(np.float64)  # the float32 division, as torch
    index = np.arange(len(row))
    order = np.lexsort((index, -scaled)) if ranked else index  # ranked: logit descending, then index
    values = scaled[order]
    weights = np.exp(values - values.max())
    margins = [1.0]
    if ranked:
        weights[(k if k > 0 else len(row)) :] = 0.0
        probs = weights / weights.sum()
        before = np.cumsum(probs) - probs
        if p < 1:
            margins.append(float(np.abs(before[probs > 0] - p).min()))
            weights = np.where(before < p, weights, 0.0)
    cdf = np.cumsum(weights) / weights.sum()
    position = int(np.searchsorted(cdf, u, side="right"))
    margins.append(float(np.abs(cdf - u).min()))
    return int(order[min(position, len(row) - 1)]), min(margins)


def _uniforms(logits: torch.Tensor, rows: RowSampling, seed: int) -> tuple[torch.Tensor, list[int]]:
    """Uniforms whose draws are not within MARGIN of a boundary (redrawn until so), and the tokens they
    select by `_expected`."""
    gen = np.random.default_rng(seed)
    uniforms, tokens = [], []
    for i in range(logits.shape[0]):
        args = (float(rows.temperature[i]), int(rows.top_k[i]), float(rows.top_p[i]))
        ranked = args[1] > 0 or args[2] < 1  # a row's own filters choose its order, never its batch's
        for _ in range(100):
            u = float(np.float32(gen.random()))
            token, margin = _expected(logits[i].float().numpy(), *args, u, ranked)
            if margin > MARGIN:
                break
        else:
            raise AssertionError(f"row {i}: no draw {MARGIN} away from a boundary (a tie at top_p?)")
        uniforms.append(u)
        tokens.append(token)
    return torch.tensor(uniforms, dtype=torch.float32), tokens


def _check(logits: torch.Tensor, rows: RowSampling, seed: int = 0) -> None:
    uniforms, want = _uniforms(logits, rows, seed)
    tokens, logprobs = sample_triton(logits, rows, uniforms)
    ref_tokens, ref_logprobs = sample_next(logits, rows, uniforms)
    assert tokens.tolist() == want, (tokens.tolist(), want)
    assert ref_tokens.tolist() == want, (ref_tokens.tolist(), want)
    assert logprobs is not None and ref_logprobs is not None
    temp = torch.where(rows.temperature > 0, rows.temperature, 1.0).double()
    exact = torch.log_softmax(logits.double() / temp.unsqueeze(1), -1)[torch.arange(len(want)), want]
    # float32 log-softmax over <= 130 terms: within 1e-5 of float64
    torch.testing.assert_close(logprobs.double(), exact, rtol=0, atol=1e-5)
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=0, atol=1e-5)


MIXED = (
    [0.0, 1.0, 0.7, 1.3, 1.0, 0.5, 2.0, 1.0],
    [0, 0, 5, 0, 3, 0, 40, 1],
    [1.0, 1.0, 1.0, 0.8, 0.9, 0.3, 1.0, 1.0],
)


@pytest.mark.parametrize("vocab", [97, 130])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_filtered_batches_draw_in_ranked_order(vocab: int, rows: int) -> None:
    """top-k and top-p rows beside greedy and plain rows: the filtering rows walk the ranked order, the
    plain ones the vocabulary order, as they would alone."""
    gen = torch.Generator().manual_seed(vocab + rows)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    temps, ks, ps = (column[-rows:] for column in MIXED)
    _check(logits, _rows(temps, ks, ps), seed=rows)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_unfiltered_batches_draw_in_vocab_order(rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, 97, generator=gen) * 2
    temps = [0.0, 1.0, 0.6, 1.5, 1.0, 0.9, 3.0, 1.0][:rows]
    _check(logits, _rows(temps, [0] * rows, [1.0] * rows), seed=rows)


def test_bf16_logits_with_masked_tokens() -> None:
    """bfloat16 logits (many exact ties) with -inf entries, as a grammar mask leaves them."""
    gen = torch.Generator().manual_seed(7)
    logits = (torch.randn(4, 97, generator=gen) * 3).to(torch.bfloat16)
    logits[:, ::3] = float("-inf")
    _check(logits, _rows([1.0, 0.8, 1.2, 0.0], [10, 0, 0, 0], [1.0, 0.7, 1.0, 1.0]), seed=3)


def test_ties_rank_by_vocab_index_at_every_cut() -> None:
    """Equal logits: the lower index ranks first at the top-k cut, the top-p cut and the draw."""
    logits = torch.zeros(4, 12)
    logits[3, 8:] = 1.0  # row 3: four tied leaders (8..11) above eight tied others
    rows = _rows([1.0, 1.0, 1.0, 1.0], [3, 0, 0, 2], [1.0, 0.5, 0.5, 1.0])
    # row 0: top-3 keeps 0, 1, 2; u = 0.9 falls in the third. row 1: top-p 0.5 over 12 equal tokens keeps
    # those whose preceding mass is below 0.5 (0..5); u = 0.2 -> the second (mass 1/6 each of the kept).
    # row 2: as row 1, u = 0.99 -> the sixth. row 3: top-2 keeps 8 and 9; u = 0.6 -> 9.
    uniforms = torch.tensor([0.9, 0.2, 0.99, 0.6])
    for fn in (sample_triton, sample_next):
        tokens, _ = fn(logits, rows, uniforms)
        assert tokens.tolist() == [2, 1, 5, 9], fn.__name__
    greedy = _rows([0.0], [0], [1.0])
    tied = torch.tensor([[0.0, 2.0, 1.0, 2.0]])
    for fn in (sample_triton, sample_next):
        assert fn(tied, greedy, torch.tensor([0.5]))[0].tolist() == [1]  # argmax: the first maximum


def test_the_interpreter_runs_the_kernel_on_its_inputs() -> None:
    """Another uniform gives another token: the kernel reads its inputs (and really ran, interpreted)."""
    logits = torch.zeros(1, 10)
    rows = _rows([1.0], [0], [1.0])
    assert sample_triton(logits, rows, torch.tensor([0.05]))[0].tolist() == [0]
    assert sample_triton(logits, rows, torch.tensor([0.95]))[0].tolist() == [9]
    assert type(sampler._kernel()).__name__ == "InterpretedFunction"
    assert sample_triton(logits, rows, torch.tensor([0.5]), want_logprobs=False)[1] is None


def test_the_engines_sampler_keeps_filtering_batches_on_the_torch_path_until_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`sample_fused`: unfiltered batches through the kernel; filtering ones through `sample_next` unless
    `RANKED_KERNEL` is set (told apart by counting the kernel's launches); the same tokens either way."""
    launches = []
    real = sampler._kernel

    def counting() -> object:
        launches.append(1)
        return real()

    monkeypatch.setattr(sampler, "_kernel", counting)
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(0))
    uniforms = torch.tensor([0.3, 0.7])
    plain, filtered = _rows([1.0, 0.5], [0, 0], [1.0, 1.0]), _rows([1.0, 0.5], [5, 0], [1.0, 0.9])
    assert (
        sample_fused(logits, plain, uniforms)[0].tolist() == sample_next(logits, plain, uniforms)[0].tolist()
    )
    assert len(launches) == 1
    assert (
        sample_fused(logits, filtered, uniforms)[0].tolist()
        == sample_next(logits, filtered, uniforms)[0].tolist()
    )
    assert len(launches) == 1  # the torch path
    monkeypatch.setattr(sampler, "RANKED_KERNEL", True)
    assert (
        sample_fused(logits, filtered, uniforms)[0].tolist()
        == sample_next(logits, filtered, uniforms)[0].tolist()
    )
    assert len(launches) == 2
