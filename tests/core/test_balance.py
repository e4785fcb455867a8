"""Token balancing over data-parallel ranks: a permutation, equal row counts, near-optimal token split."""

from __future__ import annotations

import itertools

import pytest
import torch

from quartet.core.balance import balanced_order, partition_tokens


def _best_makespan(tokens: list[int], parts: int) -> int:
    """Exhaustive optimum of the heaviest partition over equal-size partitions (tiny inputs only)."""
    size = len(tokens) // parts
    best = sum(tokens)
    for perm in itertools.permutations(range(len(tokens))):
        loads = [sum(tokens[i] for i in perm[p * size : (p + 1) * size]) for p in range(parts)]
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("seed", range(5))
def test_is_a_permutation_and_close_to_optimal(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 100, (8,), generator=g)
    perm = balanced_order(tokens, 2)
    assert sorted(perm.tolist()) == list(range(8))
    loads = partition_tokens(tokens, perm, 2)
    assert sum(loads) == int(tokens.sum())
    assert max(loads) <= _best_makespan(tokens.tolist(), 2) * 4 / 3


def test_beats_sampling_order_on_a_skewed_batch() -> None:
    tokens = torch.tensor([100, 90, 80, 70, 5, 4, 3, 2])  # sampling order puts all long rows on rank 0
    before = partition_tokens(tokens, torch.arange(8), 2)
    after = partition_tokens(tokens, balanced_order(tokens, 2), 2)
    assert max(before) == 340 and max(after) <= 180


def test_one_partition_keeps_order_and_bad_sizes_fail() -> None:
    assert balanced_order(torch.tensor([3, 1, 2]), 1).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="equal partitions"):
        balanced_order(torch.tensor([3, 1, 2]), 2)
