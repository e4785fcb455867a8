"""Outcome-score placement, DAPO overlong penalty and dynamic-sampling filter."""

from __future__ import annotations

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases, index_form, plain_keys
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.metrics import (
    DYNAMIC_SAMPLING_DROPPED_GROUPS,
    DYNAMIC_SAMPLING_DROPPED_SAMPLES,
    DYNAMIC_SAMPLING_KEPT_GROUPS,
    OVERLONG_FRACTION,
    OVERLONG_PENALTY_MEAN,
)
from quartet.core.reward_shaping import (
    dynamic_sampling_filter,
    last_valid_index,
    overlong_penalty,
    place_outcome_score,
)


@settings(max_examples=80, deadline=None)
@given(case=cases())
def test_score_sits_on_the_last_valid_token(case: Case) -> None:
    out = place_outcome_score(case.baselines, case.mask_arg)
    m = ref.bools(case.mask)
    expected = ref.zeros_like(m)
    for i, row in enumerate(m):
        pos = ref.valid_positions(row)
        if pos:
            expected[i][pos[-1]] = float(case.baselines[i])
    torch.testing.assert_close(out, ref.tensor(expected), rtol=0, atol=0)
    assert last_valid_index(case.mask).tolist() == [max(ref.valid_positions(r), default=-1) for r in m]


def test_score_skips_trailing_tool_output() -> None:
    # model, model, tool, tool, model, tool (the last model token is at position 4), then an empty row
    mask = torch.tensor([[1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]])
    out = place_outcome_score(torch.tensor([1, 2]), mask)
    assert out.dtype == torch.float32
    assert out.tolist() == [[0, 0, 0, 0, 1, 0], [0] * 6]


def test_overlong_penalty_hand_computed() -> None:
    # L_max = 20, buffer 5: no penalty up to 15, then linear: 16 -> -1/5, 18 -> -3/5, 20 -> -1, beyond -> -1
    lengths = torch.tensor([10, 15, 16, 18, 20, 25])
    out = overlong_penalty(lengths, max_response_length=20, buffer_length=5)
    torch.testing.assert_close(out.penalty, torch.tensor([0, 0, -0.2, -0.6, -1.0, -1.0], dtype=torch.float64))
    assert out.metrics[OVERLONG_FRACTION] == pytest.approx(4 / 6)
    assert out.metrics[OVERLONG_PENALTY_MEAN] == pytest.approx(-2.8 / 6)
    half = overlong_penalty(lengths, 20, 5, penalty_factor=0.5)
    torch.testing.assert_close(half.penalty, out.penalty * 0.5)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 20, 0)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 20, 21)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 64), min_size=1, max_size=10),
    max_len=st.integers(1, 48),
    buffer_frac=st.floats(0.01, 1.0),
    factor=st.sampled_from([1.0, 0.5, 2.0]),
)
def test_overlong_penalty_matches_dapo_formula(
    lengths: list[int], max_len: int, buffer_frac: float, factor: float
) -> None:
    buffer = max(1, int(max_len * buffer_frac))
    out = overlong_penalty(torch.tensor(lengths), max_len, buffer, factor)
    expected = []
    for n in lengths:  # DAPO eq. 13, case by case
        if n <= max_len - buffer:
            expected.append(0.0)
        elif n <= max_len:
            expected.append(factor * ((max_len - buffer) - n) / buffer)
        else:
            expected.append(-factor)
    torch.testing.assert_close(out.penalty, ref.tensor(expected), rtol=0, atol=1e-12)


def test_dynamic_sampling_hand_computed() -> None:
    # groups (interleaved): a = [1, 1, 1] all equal -> dropped; b = [0, 1] kept; c = [0, 0] dropped;
    # d = [0.7] alone -> kept (verl keeps singletons) or dropped with keep_singletons=False
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.7, 1.0])
    index = ["a", "b", "a", "c", "a", "c", "d", "b"]
    out = dynamic_sampling_filter(scores, index)
    assert out.keep.tolist() == [False, True, False, False, False, False, True, True]
    assert (out.kept_groups, out.dropped_groups) == (2, 2)
    assert out.metrics == {
        DYNAMIC_SAMPLING_KEPT_GROUPS: 2.0,
        DYNAMIC_SAMPLING_DROPPED_GROUPS: 2.0,
        DYNAMIC_SAMPLING_DROPPED_SAMPLES: 5.0,
    }
    strict = dynamic_sampling_filter(scores, index, keep_singletons=False)
    assert strict.keep.tolist()[6] is False and strict.dropped_groups == 3
    loose = dynamic_sampling_filter(torch.tensor([0.0, 0.05, 1.0, 1.0]), ["x", "x", "y", "y"], atol=0.1)
    assert loose.keep.tolist() == [False, False, False, False]


@settings(max_examples=80, deadline=None)
@given(
    keys=st.lists(st.integers(0, 4), min_size=1, max_size=12),
    scores_seed=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=12, max_size=12),
    form=st.sampled_from(["str", "int", "numpy", "tensor"]),
    keep_singletons=st.booleans(),
)
def test_dynamic_sampling_matches_loop_reference(
    keys: list[int], scores_seed: list[float], form: str, keep_singletons: bool
) -> None:
    scores = scores_seed[: len(keys)]
    index = index_form(keys, form)
    out = dynamic_sampling_filter(torch.tensor(scores), index, keep_singletons=keep_singletons)
    groups = ref.groups_of(plain_keys(index))
    keep = [False] * len(keys)
    kept = 0
    for members in groups.values():
        vals = [scores[i] for i in members]
        if max(vals) != min(vals) or (keep_singletons and len(members) == 1):
            kept += 1
            for i in members:
                keep[i] = True
    assert out.keep.tolist() == keep
    assert out.kept_groups == kept and out.dropped_groups == len(groups) - kept
    assert out.metrics[DYNAMIC_SAMPLING_DROPPED_SAMPLES] == keep.count(False)
