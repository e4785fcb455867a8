"""Advantage estimators against slow loop references (random masks with holes) and hand-computed cases."""

from __future__ import annotations

import math

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases, multi_turn_case, plain_keys
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.advantages import (
    ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    compute_gae,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
    group_ids,
    masked_whiten,
)
from quartet.core.choices import AdvantageEstimator
from quartet.core.metrics import ADV_SINGLETON_GROUPS

TOL = 1e-6


def close(actual: torch.Tensor, expected: ref.Rows | list[float]) -> None:
    torch.testing.assert_close(actual, ref.tensor(expected), rtol=0, atol=TOL)


def reference(estimator: AdvantageEstimator, case: Case, p: AdvantageParams) -> tuple[ref.Rows, ref.Rows]:
    r, m, keys = ref.rows(case.rewards), ref.bools(case.mask), plain_keys(case.index)
    match estimator:
        case AdvantageEstimator.GAE:
            adv, ret = ref.gae(r, ref.rows(case.values), m, p.gamma, p.lam)
            return (ref.whiten(adv, m) if p.whiten else adv), ret
        case AdvantageEstimator.GRPO:
            adv = ref.grpo(r, m, keys, p.epsilon, p.norm_adv_by_std)
        case AdvantageEstimator.DR_GRPO:
            adv = ref.grpo(r, m, keys, p.epsilon, by_std=False)
        case AdvantageEstimator.RLOO:
            adv = ref.rloo(r, m, keys)
        case AdvantageEstimator.OPO:
            adv = ref.opo(r, m, keys)
        case AdvantageEstimator.REINFORCE_PLUS_PLUS:
            return ref.reinforce_pp(r, m, p.gamma)
        case AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE:
            adv = ref.reinforce_pp_baseline(r, m, keys)
        case AdvantageEstimator.REMAX:
            return ref.remax(r, m, case.baselines.tolist())
    return adv, adv  # outcome estimators: returns = advantages


def test_every_estimator_has_a_function() -> None:
    assert set(ESTIMATORS) == set(AdvantageEstimator)
    assert all(callable(fn) for fn in ESTIMATORS.values())


@pytest.mark.parametrize("estimator", list(AdvantageEstimator))
@settings(max_examples=60, deadline=None)
@given(
    case=cases(),
    gamma=st.sampled_from([1.0, 0.9]),
    lam=st.sampled_from([1.0, 0.95, 0.3]),
    whiten=st.booleans(),
    norm=st.booleans(),
)
def test_estimator_matches_loop_reference(
    estimator: AdvantageEstimator, case: Case, gamma: float, lam: float, whiten: bool, norm: bool
) -> None:
    check_against_reference(
        estimator, case, AdvantageParams(gamma=gamma, lam=lam, norm_adv_by_std=norm, whiten=whiten)
    )


@pytest.mark.parametrize("estimator", list(AdvantageEstimator))
@pytest.mark.parametrize("float_mask", [False, True])
def test_estimator_on_fixed_multi_turn_batch(estimator: AdvantageEstimator, float_mask: bool) -> None:
    case = multi_turn_case(float_mask)
    for params in (
        AdvantageParams(),
        AdvantageParams(gamma=0.9, lam=0.7, norm_adv_by_std=False, whiten=True),
    ):
        check_against_reference(estimator, case, params)
    out = compute_advantages(
        estimator, AdvantageInputs(case.rewards, case.mask_arg, case.values, case.index, case.baselines)
    )
    assert torch.all(out.advantages[1] == 0)  # the all-masked row
    assert torch.all(out.advantages[3, [3, 4, 6]] != 0)  # model turns after tool spans (row 3 is in g0)


def check_against_reference(estimator: AdvantageEstimator, case: Case, params: AdvantageParams) -> None:
    inputs = AdvantageInputs(case.rewards, case.mask_arg, case.values, case.index, case.baselines)
    out = compute_advantages(estimator, inputs, params)
    expected_adv, expected_ret = reference(estimator, case, params)
    close(out.advantages, expected_adv)
    close(out.returns, expected_ret)
    # Exactly 0 (not just close) on tool tokens and padding, and never NaN.
    assert torch.all(out.advantages[~case.mask] == 0) and torch.all(out.returns[~case.mask] == 0)
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    if estimator.needs_group:
        assert out.metrics[ADV_SINGLETON_GROUPS] == ref.singleton_groups(plain_keys(case.index))


def test_gae_hand_computed_with_a_hole() -> None:
    # gamma = 0.9, lam = 0.8, row 0 = [model, model, TOOL, model]; the tool token's reward 9 and value 7 are
    # ignored, so the value after t=1 is V[3] = 0.4:
    #   t=3: delta = 1 + 0.9*0 - 0.4 = 0.6                 A3 = 0.6
    #   t=1: delta = 0 + 0.9*0.4 - 0.2 = 0.16              A1 = 0.16 + 0.72*0.6 = 0.592
    #   t=0: delta = 0 + 0.9*0.2 - 0.5 = -0.32             A0 = -0.32 + 0.72*0.592 = 0.10624
    # returns = A + V: 0.60624, 0.792, 0, 1.0. Row 1 is all masked: zeros.
    rewards = torch.tensor([[0.0, 0.0, 9.0, 1.0], [5.0, 5.0, 5.0, 5.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.2, 7.0, 0.4], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0]])
    out = compute_gae(rewards, values, mask, gamma=0.9, lam=0.8)
    close(out.advantages, [[0.10624, 0.592, 0.0, 0.6], [0.0] * 4])
    close(out.returns, [[0.60624, 0.792, 0.0, 1.0], [0.0] * 4])


def test_gae_whitening_over_valid_tokens() -> None:
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]], dtype=torch.float64)
    values = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]], dtype=torch.bool)
    raw = compute_gae(rewards, values, mask)
    white = compute_gae(rewards, values, mask, whiten=True)
    valid = white.advantages[mask]
    assert abs(float(valid.mean())) < 1e-12
    assert float(valid.std()) == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(white.returns, raw.returns)  # returns come from the raw advantages


def test_grpo_hand_computed_interleaved_groups() -> None:
    # Groups in arbitrary order: a = rows 0,2,4,6 with scores 1,0,0,1; c = rows 1,5 with 2,4; b = row 3 alone.
    # a: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.5773502692 -> +-0.5 / 0.5773512692 = +-0.8660239
    # c: mean 3, std sqrt(2) = 1.4142135624 -> +-1 / 1.4142145624 = +-0.7071063
    # b: one sample -> 0 (and counted). Dr.GRPO: a +-0.5, c +-1, b 0.
    scores = [1.0, 2.0, 0.0, 3.0, 0.0, 4.0, 1.0]
    mask = torch.tensor([[1, 1, 0]] * 7)
    rewards = torch.zeros(7, 3, dtype=torch.float64)
    rewards[:, 1] = torch.tensor(scores, dtype=torch.float64)
    index = ["a", "c", "a", "b", "a", "c", "a"]
    a, c = 0.5 / (math.sqrt(1 / 3) + 1e-6), 1 / (math.sqrt(2) + 1e-6)
    assert a == pytest.approx(0.8660239, abs=1e-7) and c == pytest.approx(0.7071063, abs=1e-7)
    out = compute_grpo(rewards, mask, index)
    per_row = [a, -c, -a, 0.0, -a, c, a]
    close(out.advantages, [[v, v, 0.0] for v in per_row])
    assert out.metrics[ADV_SINGLETON_GROUPS] == 1
    dr = compute_advantages(AdvantageEstimator.DR_GRPO, AdvantageInputs(rewards, mask, index=index))
    close(dr.advantages, [[v, v, 0.0] for v in [0.5, -1.0, -0.5, 0.0, -0.5, 1.0, 0.5]])


def test_grpo_equal_rewards_and_empty_rows_give_zero_not_nan() -> None:
    rewards = torch.ones(4, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.float32)
    out = compute_grpo(rewards, mask, ["p", "p", "q", "q"])
    assert torch.isfinite(out.advantages).all()
    # group p: scores 3 and 1 -> +-1/sqrt(2); group q: both empty, scores 0 and 0 -> exactly 0
    assert torch.all(out.advantages[2:] == 0)
    assert out.advantages[0, 0] > 0 > out.advantages[1, 0]


def test_rloo_hand_computed() -> None:
    # scores 1, 2, 6: baselines are the means of the others: 4, 3.5, 1.5 -> -3, -1.5, 4.5
    rewards = torch.tensor([[1.0], [2.0], [6.0]], dtype=torch.float64)
    out = compute_rloo(rewards, torch.ones(3, 1), torch.tensor([7, 7, 7]))
    close(out.advantages, [[-3.0], [-1.5], [4.5]])


def test_reinforce_pp_discount_skips_the_hole() -> None:
    # valid tokens 0, 2, 3 (1 is a tool token): G3 = 1, G2 = 0.5 * 1 = 0.5, G0 = 0.25 (two valid steps)
    rewards = torch.tensor([[0.0, 100.0, 0.0, 1.0]], dtype=torch.float64)
    out = compute_reinforce_plus_plus(rewards, torch.tensor([[1, 0, 1, 1]]), gamma=0.5)
    close(out.returns, [[0.25, 0.0, 0.5, 1.0]])
    assert out.advantages[0, 1] == 0


def test_missing_inputs_are_named() -> None:
    inputs = AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="values"):
        compute_advantages(AdvantageEstimator.GAE, inputs)
    with pytest.raises(ValueError, match="index"):
        compute_advantages(AdvantageEstimator.RLOO, inputs)
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_advantages(AdvantageEstimator.REMAX, inputs)
    with pytest.raises(ValueError, match="must both be"):
        compute_advantages(AdvantageEstimator.GRPO, AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 4)))
    with pytest.raises(ValueError, match="3 prompt ids for 2"):
        compute_grpo(torch.zeros(2, 3), torch.ones(2, 3), ["a", "b", "c"])


def test_estimator_accepts_its_string_value() -> None:
    inputs = AdvantageInputs(torch.ones(2, 2), torch.ones(2, 2), index=["a", "a"])
    out = compute_advantages("rloo", inputs)  # type: ignore[arg-type]
    assert torch.all(out.advantages == 0)


def test_group_ids_is_dense_and_consistent_across_forms() -> None:
    ids, n = group_ids(["x", "y", "x", "z"])
    assert n == 3 and ids.tolist() == [0, 1, 0, 2]
    ids_t, n_t = group_ids(torch.tensor([5, 9, 5, 1]))
    assert n_t == 3 and ids_t[0] == ids_t[2] and len(set(ids_t.tolist())) == 3


def test_masked_whiten_ignores_masked_garbage() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0], [5.0, float("inf"), 7.0]])
    mask = torch.tensor([[1, 0, 1], [1, 0, 1]])
    out = masked_whiten(x, mask)
    assert torch.isfinite(out).all() and out[0, 1] == 0 and out[1, 1] == 0
    assert float(out[mask.bool()].sum()) == pytest.approx(0.0, abs=1e-6)


def test_advantages_carry_no_gradient() -> None:
    values = torch.randn(2, 3, requires_grad=True)
    out = compute_advantages(
        AdvantageEstimator.GAE, AdvantageInputs(torch.randn(2, 3), torch.ones(2, 3), values=values)
    )
    assert not out.advantages.requires_grad and not out.returns.requires_grad
