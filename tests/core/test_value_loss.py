"""Clipped value loss against a loop reference, a hand-computed case, and explained variance."""

from __future__ import annotations

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.choices import LossAggMode
from quartet.core.metrics import VF_CLIPFRAC, VF_LOSS, VPRED_MEAN, explained_variance
from quartet.core.value_loss import compute_value_loss


@settings(max_examples=80, deadline=None)
@given(case=cases(), mode=st.sampled_from(list(LossAggMode)), clip=st.sampled_from([0.05, 0.5, 2.0]))
def test_value_loss_matches_loop_reference(case: Case, mode: LossAggMode, clip: float) -> None:
    vpreds = case.values.clone().requires_grad_(True)
    old = case.values + case.adv  # old values somewhere around the new ones
    returns = case.rewards
    out = compute_value_loss(vpreds, old, returns, case.mask_arg, clip, agg_mode=mode)
    m = ref.bools(case.mask)
    losses, flags = ref.value_tokens(ref.rows(case.values), ref.rows(old), ref.rows(returns), clip)
    assert float(out.loss.detach()) == pytest.approx(ref.aggregate(losses, m, str(mode)), abs=1e-6)
    assert float(out.metrics[VF_CLIPFRAC]) == pytest.approx(ref.masked_token_mean(flags, m), abs=1e-6)
    assert float(out.metrics[VPRED_MEAN]) == pytest.approx(ref.masked_token_mean(ref.rows(case.values), m))
    out.loss.backward()
    assert vpreds.grad is not None and torch.all(vpreds.grad[~case.mask] == 0)


def test_value_loss_hand_computed() -> None:
    # cliprange 0.5, returns R = 1:
    #   V=2.0, V_old=0.0: V_clip = 0.5 -> max((2-1)^2, (0.5-1)^2) = 1      (unclipped term wins)
    #   V=0.0, V_old=2.0: V_clip = 1.5 -> max(1, 0.25) = 1                 (unclipped term wins)
    #   V=1.2, V_old=2.0: V_clip = 1.5 -> max(0.04, 0.25) = 0.25           (clip active)
    #   4th token masked
    # loss = 0.5 * (1 + 1 + 0.25) / 3 = 0.375; clip fraction 1/3
    vpreds = torch.tensor([[2.0, 0.0, 1.2, 50.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[0.0, 2.0, 2.0, 0.0]], dtype=torch.float64)
    returns = torch.ones(1, 4, dtype=torch.float64)
    out = compute_value_loss(vpreds, old, returns, torch.tensor([[1, 1, 1, 0]]), 0.5)
    assert float(out.loss.detach()) == pytest.approx(0.375)
    assert float(out.metrics[VF_LOSS]) == pytest.approx(0.375)
    assert float(out.metrics[VF_CLIPFRAC]) == pytest.approx(1 / 3)
    out.loss.backward()
    # d/dV of 0.5 * (V - R)^2 / 3 = (V - R) / 3 on unclipped tokens; 0 where the clipped term wins
    assert vpreds.grad is not None
    torch.testing.assert_close(vpreds.grad, torch.tensor([[1 / 3, -1 / 3, 0.0, 0.0]], dtype=torch.float64))


def test_cliprange_must_be_positive() -> None:
    with pytest.raises(ValueError):
        compute_value_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.0)


@settings(max_examples=60, deadline=None)
@given(case=cases())
def test_explained_variance_matches_reference(case: Case) -> None:
    m = ref.bools(case.mask)
    v, r = ref.rows(case.values), ref.rows(case.rewards)
    pos = [(i, t) for i in range(len(m)) for t in ref.valid_positions(m[i])]
    if len(pos) < 2:
        expected = 0.0
    else:
        rets = [r[i][t] for i, t in pos]
        diffs = [r[i][t] - v[i][t] for i, t in pos]
        expected = 1.0 - ref.variance(diffs) / (ref.variance(rets) + 1e-5)
    out = explained_variance(case.values, case.rewards, case.mask_arg)
    assert float(out) == pytest.approx(expected, abs=1e-6)


def test_explained_variance_extremes() -> None:
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert float(explained_variance(torch.full_like(returns, 2.5), returns, mask)) == pytest.approx(
        0.0, abs=1e-4
    )
