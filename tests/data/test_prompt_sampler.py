"""PromptSampler: seeded epochs that cover every row, and a state that resumes with the exact next batch."""

from __future__ import annotations

import json

import numpy as np
import pytest

from quartet.data.sampler import PromptSampler, SamplerStateError


def _draw(sampler: PromptSampler, n: int) -> list[list[int]]:
    return [sampler.next_indices() for _ in range(n)]


def test_epochs_are_seeded_permutations_covering_every_row() -> None:
    sampler = PromptSampler(dataset_size=12, batch_size=4, shuffle=True, seed=7)
    assert sampler.steps_per_epoch == 3 and sampler.epoch == 0
    for epoch in range(3):
        batches = _draw(sampler, 3)
        assert all(len(b) == 4 for b in batches)
        seen = [i for b in batches for i in b]
        assert sorted(seen) == list(range(12))  # every row exactly once
        # the order is numpy's permutation of seed + epoch (the documented rule, computed independently)
        assert seen == np.random.default_rng(7 + epoch).permutation(12).tolist()
        assert sampler.epoch == epoch + 1
    first, second = _draw(PromptSampler(12, 4, seed=7), 3), _draw(PromptSampler(12, 4, seed=7), 3)
    assert first == second
    assert first != _draw(PromptSampler(12, 4, seed=8), 3)
    assert _draw(PromptSampler(12, 4, shuffle=False), 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_drop_last_and_keep_last() -> None:
    dropping = PromptSampler(10, 4, shuffle=False)
    assert dropping.steps_per_epoch == 2
    assert _draw(dropping, 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    keeping = PromptSampler(10, 4, shuffle=False, drop_last=False)
    assert keeping.steps_per_epoch == 3
    assert _draw(keeping, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3]]
    # with shuffling, rows left out at the end of one epoch come back in the next
    sampler = PromptSampler(10, 4, seed=1)
    seen = {i for b in _draw(sampler, 2 * 50) for i in b}
    assert seen == set(range(10))


@pytest.mark.parametrize(
    "taken", [0, 1, 2, 3, 4, 5, 6, 7]
)  # mid-epoch and exactly at epoch boundaries (3, 6)
def test_resume_gives_exactly_the_next_batches(taken: int) -> None:
    uninterrupted = PromptSampler(13, 4, seed=3)
    reference = _draw(uninterrupted, taken + 6)

    first_run = PromptSampler(13, 4, seed=3)
    assert _draw(first_run, taken) == reference[:taken]
    state = json.loads(json.dumps(first_run.state_dict()))  # as a checkpoint would store it
    resumed = PromptSampler(13, 4, seed=3)
    resumed.load_state_dict(state)
    assert resumed.epoch == first_run.epoch
    assert _draw(resumed, 6) == reference[taken:]


def test_a_state_saved_at_the_end_of_an_epoch_starts_the_next() -> None:
    sampler = PromptSampler(8, 4, shuffle=False)
    sampler.load_state_dict({"epoch": 0, "position": 8})
    assert sampler.epoch == 1 and sampler.next_indices() == [0, 1, 2, 3]


def test_wrong_sizes_and_foreign_states_are_refused() -> None:
    with pytest.raises(ValueError, match="fewer than one batch of 8"):
        PromptSampler(5, 8)
    sampler = PromptSampler(12, 4, seed=3)
    state = sampler.state_dict()
    with pytest.raises(SamplerStateError, match="seed: saved 3, now 4"):
        PromptSampler(12, 4, seed=4).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="dataset_size: saved 12, now 16"):
        PromptSampler(16, 4, seed=3).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="invalid saved data position"):
        sampler.load_state_dict({**state, "position": 13})
