"""KL estimators, the straight-through variants, the KL loss term, the in-reward penalty and controllers."""

from __future__ import annotations

import math

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.config.algorithm import KLControl as ConfigKLControl
from quartet.core.choices import KLControl, KLPenalty, LossAggMode
from quartet.core.kl import (
    DEFAULT_MIN_COEF,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    apply_kl_penalty,
    kl_estimate,
    kl_loss_term,
    make_kl_controller,
)
from quartet.core.metrics import KL_COEF, KL_LOSS, REWARD_KL_PENALTY, REWARD_KL_PENALTY_COEF

COMPUTABLE = [k for k in KLPenalty if k is not KLPenalty.FULL]
PLUS = [k for k in KLPenalty if k.value.endswith("+")]


def test_every_kl_penalty_has_an_estimator() -> None:
    assert set(KL_ESTIMATORS) == set(KLPenalty)
    assert KLPenalty("k3+").straight_through and not KLPenalty.K3.straight_through
    # every name verl 0.9.1 accepts for kl_penalty / kl_loss_type
    verl_names = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full"}
    verl_names |= {"kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"}
    assert {k.value for k in KLPenalty} == verl_names


def test_full_is_refused_with_the_reason() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(NotImplementedError, match="vocabulary"):
        kl_estimate(x, x, KLPenalty.FULL)


@pytest.mark.parametrize("kind", COMPUTABLE)
@settings(max_examples=40, deadline=None)
@given(
    x=st.lists(st.floats(-25.0, 25.0, allow_nan=False), min_size=1, max_size=12),
    base=st.floats(-5.0, 0.0),
)
def test_estimators_match_the_formulas(kind: KLPenalty, x: list[float], base: float) -> None:
    logp = torch.tensor(x, dtype=torch.float64) + base
    ref_logp = torch.full_like(logp, base)
    out = kl_estimate(logp, ref_logp, kind)
    expected = [ref.kl_value(a, base, str(kind)) for a in logp.tolist()]
    torch.testing.assert_close(out, ref.tensor(expected), rtol=1e-9, atol=1e-6)


def test_k3_is_nonnegative_and_k1_can_be_negative() -> None:
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    zero = torch.zeros_like(x)
    assert torch.all(kl_estimate(x, zero, KLPenalty.K3) >= 0)
    assert torch.any(kl_estimate(x, zero, KLPenalty.K1) < 0)


@pytest.mark.parametrize(
    ("kind", "value_of"),
    [(k, k.base) for k in PLUS if k.base not in (KLPenalty.K2, KLPenalty.MSE)],
)
def test_straight_through_value_of_one_gradient_of_k2(kind: KLPenalty, value_of: KLPenalty) -> None:
    g = torch.Generator().manual_seed(1)
    logp = (-torch.rand(3, 5, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    ref_logp = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 3
    est = kl_estimate(logp, ref_logp, kind)
    # forward value: exactly the named estimator's
    torch.testing.assert_close(est, kl_estimate(logp, ref_logp, value_of), rtol=0, atol=1e-12)
    (grad,) = torch.autograd.grad(est.sum(), logp)
    # gradient: that of k2 = (logp - ref)^2 / 2, i.e. logp - ref, computed by autograd on k2 itself
    (k2_grad,) = torch.autograd.grad(kl_estimate(logp, ref_logp, KLPenalty.K2).sum(), logp)
    torch.testing.assert_close(grad, k2_grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(grad, (logp - ref_logp).detach(), rtol=0, atol=1e-12)
    # and not the estimator's own gradient (1 - exp(-(logp - ref)) for k3, 1 for k1)
    (own_grad,) = torch.autograd.grad(kl_estimate(logp, ref_logp, value_of).sum(), logp)
    assert (own_grad - grad).abs().max() > 1e-3


@settings(max_examples=60, deadline=None)
@given(case=cases(), kind=st.sampled_from(COMPUTABLE), mode=st.sampled_from(list(LossAggMode)))
def test_kl_loss_term_matches_reference(case: Case, kind: KLPenalty, mode: LossAggMode) -> None:
    out = kl_loss_term(case.logp, case.ref, case.mask_arg, kind, coef=0.3, agg_mode=mode)
    lp, rp, m = ref.rows(case.logp), ref.rows(case.ref), ref.bools(case.mask)
    kl = [
        [ref.kl_value(a, b, str(kind)) for a, b in zip(ra, rb, strict=True)]
        for ra, rb in zip(lp, rp, strict=True)
    ]
    expected = ref.aggregate(kl, m, str(mode))
    assert float(out.metrics[KL_LOSS]) == pytest.approx(expected, abs=1e-6)
    assert float(out.loss) == pytest.approx(0.3 * expected, abs=1e-6)
    assert float(out.metrics[KL_COEF]) == pytest.approx(0.3)


def test_kl_loss_gradient_flows_to_the_policy_only() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref_logp = torch.tensor([[-1.5, -1.0]], requires_grad=True)
    out = kl_loss_term(logp, ref_logp, torch.ones(1, 2), KLPenalty.K2, coef=1.0)
    out.loss.backward()
    # token-mean of 0.5 x^2: d/dlogp = x / 2 = [0.25, -0.5]
    assert logp.grad is not None and ref_logp.grad is None
    torch.testing.assert_close(logp.grad, torch.tensor([[0.25, -0.5]]))


@settings(max_examples=60, deadline=None)
@given(case=cases(), kind=st.sampled_from(COMPUTABLE))
def test_kl_penalty_in_reward_matches_reference(case: Case, kind: KLPenalty) -> None:
    out = apply_kl_penalty(case.rewards, case.old, case.ref, case.mask_arg, coef=0.05, kind=kind)
    m = ref.bools(case.mask)
    scores, old, rp = ref.rows(case.rewards), ref.rows(case.old), ref.rows(case.ref)
    expected = [[0.0] * len(row) for row in m]
    per_seq = []
    for i in range(len(m)):
        kls = []
        for t in range(len(m[i])):
            kl = ref.kl_value(old[i][t], rp[i][t], str(kind)) if m[i][t] else 0.0
            expected[i][t] = scores[i][t] - 0.05 * kl
            if m[i][t]:
                kls.append(kl)
        if kls:
            per_seq.append(sum(kls) / len(kls))
    current = sum(per_seq) / len(per_seq) if per_seq else 0.0
    torch.testing.assert_close(out.token_level_rewards, ref.tensor(expected), rtol=0, atol=1e-6)
    assert out.current_kl == pytest.approx(current, abs=1e-6)
    assert out.metrics[REWARD_KL_PENALTY] == out.current_kl
    assert out.metrics[REWARD_KL_PENALTY_COEF] == 0.05


def test_adaptive_controller_follows_ziegler_rule() -> None:
    # target 0.1, horizon 100, start 0.2; e = clip(kl / 0.1 - 1, -0.2, 0.2); coef *= 1 + e * n / 100
    #   kl 0.30, n 10: e = +0.2 (clipped from 2.0) -> 0.2 * 1.02 = 0.204
    #   kl 0.10, n 10: e = 0                       -> 0.204
    #   kl 0.05, n 10: e = -0.2 (clipped from -0.5) -> 0.204 * 0.98 = 0.19992
    #   kl 0.11, n 10: e = +0.1                    -> 0.19992 * 1.01 = 0.2019192
    #   kl 0.00, n 10: e = -0.2 (clipped from -1)  -> 0.2019192 * 0.98 = 0.197880816
    #   kl 0.12, n 50: e = +0.2                    -> 0.197880816 * 1.1 = 0.2176688976
    ctrl = AdaptiveKLController(0.2, target_kl=0.1, horizon=100)
    expected = [0.204, 0.204, 0.19992, 0.2019192, 0.197880816, 0.2176688976]
    observed = [(0.3, 10), (0.1, 10), (0.05, 10), (0.11, 10), (0.0, 10), (0.12, 50)]
    for (kl, n), value in zip(observed, expected, strict=True):
        ctrl.update(kl, n)
        assert ctrl.value == pytest.approx(value, rel=1e-12)


def test_controller_state_round_trip() -> None:
    a = make_kl_controller(KLControl.ADAPTIVE, 0.1, target_kl=0.05, horizon=1000)
    for kl in (0.2, 0.01, 0.07):
        a.update(kl, 64)
    state = a.state_dict()
    b = make_kl_controller(KLControl.ADAPTIVE, 0.1, target_kl=0.05, horizon=1000)
    b.load_state_dict(state)
    assert b.value == a.value != 0.1
    for kl in (0.3, 0.02):
        a.update(kl, 64)
        b.update(kl, 64)
    assert b.value == a.value
    fixed = FixedKLController(0.1)
    with pytest.raises(ValueError, match="adaptive"):
        fixed.load_state_dict(state)


def test_fixed_controller_and_config_enum() -> None:
    ctrl = make_kl_controller(ConfigKLControl.FIXED, 0.01)
    ctrl.update(5.0, 1000)
    assert isinstance(ctrl, FixedKLController) and ctrl.value == 0.01
    assert isinstance(make_kl_controller(ConfigKLControl.ADAPTIVE, 0.01), AdaptiveKLController)
    assert {m.value for m in ConfigKLControl} == {m.value for m in KLControl}
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)
    with pytest.raises(ValueError):
        FixedKLController(-1.0)


def test_k3_is_accurate_for_tiny_log_ratios() -> None:
    x = torch.tensor([1e-9], dtype=torch.float64)
    # x^2 / 2 to leading order; a naive exp(-x) - 1 + x loses all digits here
    assert float(kl_estimate(x, torch.zeros_like(x), KLPenalty.K3)) == pytest.approx(5e-19, rel=1e-6)
    assert float(kl_estimate(x, torch.zeros_like(x), KLPenalty.LOW_VAR_KL)) == pytest.approx(5e-19, rel=1e-6)
    assert math.isfinite(float(kl_estimate(torch.tensor([100.0]), torch.tensor([0.0]), KLPenalty.LOW_VAR_KL)))


K3_NAMES = [KLPenalty.K3, KLPenalty.LOW_VAR_KL, KLPenalty.K3_PLUS, KLPenalty.LOW_VAR_KL_PLUS]


@pytest.mark.parametrize("kind", K3_NAMES)
def test_k3_is_clamped_as_verl_at_extreme_log_ratios(kind: KLPenalty) -> None:
    # x = logp - ref = -25: y = 25 is clipped to 20, e^20 - 21 = 4.85e8 is clipped to 10 (raw k3: 7.2e10).
    # x = +25: y = -25 clipped to -20, e^-20 + 20 - 1 = 19.000000002 clipped to 10.
    # x = -2: y = 2, e^2 - 3 = 4.389 (no clamp bites).
    logp = torch.tensor([[-25.0, 25.0, -2.0, 0.0]], dtype=torch.float64, requires_grad=True)
    ref_logp = torch.zeros(1, 4, dtype=torch.float64)
    value = kl_estimate(logp, ref_logp, kind)
    expected = [10.0, 10.0, math.exp(2.0) - 3.0, 0.0]
    torch.testing.assert_close(value.detach(), torch.tensor([expected], dtype=torch.float64))
    assert math.exp(25.0) - 26.0 > 7e10  # what an unclamped k3 gives at -25
    (grad,) = torch.autograd.grad(value.sum(), logp)
    assert torch.isfinite(grad).all()
    by_hand = [ref.kl_grad(a, 0.0, str(kind)) for a in logp.detach()[0].tolist()]
    torch.testing.assert_close(grad, torch.tensor([by_hand], dtype=torch.float64))
    loss = kl_loss_term(logp, ref_logp, torch.ones(1, 4), kind, coef=1.0)
    assert torch.isfinite(loss.loss) and float(loss.loss.detach()) <= 10.0


def test_adaptive_coefficient_stops_at_its_floor_not_below() -> None:
    # e = -0.2 (KL far under target), n_steps = 10 * horizon: factor 1 - 0.2 * 10 = -1 (verl: beta -> -beta)
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=10)
    ctrl.update(0.0, n_steps=100)
    assert ctrl.value == DEFAULT_MIN_COEF > 0
    # exactly at the boundary factor 0 (verl: beta = 0 forever); min_coef=0 is verl's rule clamped at 0
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=10, min_coef=0.0)
    ctrl.update(0.0, n_steps=50)
    assert ctrl.value == 0.0
    ctrl.update(9.0, n_steps=50)
    assert ctrl.value == 0.0  # without a floor nothing brings it back, as in verl
    # an ordinary step still moves as Ziegler's rule says
    ctrl = AdaptiveKLController(0.05, target_kl=0.1, horizon=10)
    ctrl.update(0.0, n_steps=1)
    assert ctrl.value == pytest.approx(0.05 * 0.98)


@pytest.mark.parametrize("start", [0.0, "floor"])
def test_adaptive_coefficient_recovers_at_kl_9_against_target_1(start: object) -> None:
    # the case: KL 9 against a target of 1, the coefficient at 0 (or driven to the floor by a
    # factor <= 0). e = clip(9 / 1 - 1) = +0.2; with n_steps 64 and horizon 640 the factor is 1.02, so
    # from the floor 1e-6 the coefficient multiplies by 1.02 per update: 1e-6 * 1.02^349 = 1.0e-3.
    ctrl = AdaptiveKLController(0.001, target_kl=1.0, horizon=640)
    if start == "floor":
        ctrl.update(0.0, n_steps=640 * 6)  # factor 1 - 0.2 * 6 < 0: verl's beta flips sign, ours floors
    else:
        ctrl.value = 0.0  # as restored from a checkpoint of a run that reached 0
    first = ctrl.value
    values = []
    for _ in range(349):
        ctrl.update(9.0, n_steps=64)
        values.append(ctrl.value)
    assert first == (DEFAULT_MIN_COEF if start == "floor" else 0.0)
    assert values[0] == pytest.approx(DEFAULT_MIN_COEF * (1.02 if start == "floor" else 1.0), rel=1e-12)
    assert all(b > a for a, b in zip(values, values[1:], strict=False))  # rises at every update
    rises = 349 if start == "floor" else 348  # from 0 the first update only lifts it to the floor
    assert values[-1] == pytest.approx(DEFAULT_MIN_COEF * 1.02**rises, rel=1e-9)
    assert values[-1] > 0.9e-3


@pytest.mark.parametrize("kind", [KLPenalty.K2_PLUS, KLPenalty.MSE_PLUS])
def test_k2_plus_is_k2(kind: KLPenalty) -> None:
    logp = torch.tensor([[-0.3, -2.0, -7.0]], dtype=torch.float64, requires_grad=True)
    ref_logp = torch.tensor([[-1.0, -0.5, -0.1]], dtype=torch.float64)
    (grad,) = torch.autograd.grad(kl_estimate(logp, ref_logp, kind).sum(), logp)
    x = (logp - ref_logp).detach()
    torch.testing.assert_close(kl_estimate(logp, ref_logp, kind).detach(), 0.5 * x * x)
    torch.testing.assert_close(grad, x)


def test_min_coef_is_a_config_key_that_reaches_the_controller() -> None:
    # built as the trainer builds it (tests/trainer/loop/test_rl_steps.py checks the trainer's own call;
    # importing the trainer here would cost ~10 s)
    from quartet.config import ConfigError, QuartetConfig, load_config

    def kl_controller(cfg: QuartetConfig) -> KLController:
        k = cfg.algorithm.kl_ctrl
        return make_kl_controller(k.kind, k.coef, k.target_kl, k.horizon, k.min_coef)

    base = [
        "algorithm.kl_ctrl.kind=adaptive",
        "algorithm.kl_ctrl.target_kl=1.0",
        "algorithm.kl_ctrl.horizon=10",
    ]
    default = kl_controller(load_config(overrides=base))
    assert isinstance(default, AdaptiveKLController) and default.min_coef == DEFAULT_MIN_COEF
    ctrl = kl_controller(load_config(overrides=[*base, "algorithm.kl_ctrl.min_coef=0.0005"]))
    ctrl.update(0.0, n_steps=100)  # factor 1 - 0.2 * 10 = -1: to the floor
    assert ctrl.value == 0.0005
    ctrl.update(9.0, n_steps=5)  # factor 1 + 0.2 * 5 / 10 = 1.1
    assert ctrl.value == pytest.approx(0.00055, rel=1e-12)
    with pytest.raises(ConfigError, match="min_coef"):
        load_config(overrides=[*base, "algorithm.kl_ctrl.min_coef=-1"])
    with pytest.raises(ConfigError, match="lower min_coef"):
        load_config(overrides=[*base, "algorithm.kl_ctrl.coef=0.0001", "algorithm.kl_ctrl.min_coef=0.001"])
    # a fixed coefficient below the (unused) floor, and an adaptive one starting at 0, are fine
    load_config(overrides=["algorithm.kl_ctrl.coef=1e-8"])
    zero = kl_controller(load_config(overrides=[*base, "algorithm.kl_ctrl.coef=0"]))
    zero.update(9.0, n_steps=1)
    assert zero.value == DEFAULT_MIN_COEF
