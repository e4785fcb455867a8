"""Parity with verl 0.9.1: quartet's functions against verl's formulas, on random masked inputs.

The references are written from verl's documentation (the `kl_penalty` / `kl_loss_type` names, the
`loss_agg_mode` names and their global-batch denominators with `dp_size`, the adaptive controller) and
the papers (Schulman 2020 for the KL estimators, Ziegler et al. 2019 for the controller, Zheng et al. 2025
for GSPO), as slow loops in `reference_algos` and here; no verl code is used or copied. Where quartet
departs from verl on purpose the test states the departure and checks it (empty rows in the controller's
batch KL, a negative adaptive coefficient, `full`).
"""

from __future__ import annotations

import math

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.choices import KLPenalty, LossAggMode, PolicyLoss
from quartet.core.kl import AdaptiveKLController, apply_kl_penalty, kl_estimate, kl_loss_term
from quartet.core.loss_agg import aggregate_loss, count_valid_sequences, count_valid_tokens
from quartet.core.policy_loss import ClipParams, compute_policy_loss

KL_NAMES = [k for k in KLPenalty if k is not KLPenalty.FULL]
VERL_MODES = [m for m in LossAggMode if m is not LossAggMode.TOKEN_SUM]


def verl_agg(
    loss: ref.Rows, mask: ref.Mask, mode: str, dp_size: int, n_tok: float, n_seq: float, c: float
) -> float:
    """verl 0.9.1's documented `agg_loss` on one micro-batch of one rank, given the global batch's counts.

    token-mean: masked sum / global tokens * dp_size; seq-mean-token-sum(-norm): sum over rows with a valid
    token of their token sums / global sequences * dp_size (then / C for -norm); seq-mean-token-mean: the
    same with each row's token mean; token-sum: the masked sum.
    """
    sums, means = [], []
    for i in range(len(mask)):
        pos = ref.valid_positions(mask[i])
        if pos:
            s = sum(loss[i][t] for t in pos)
            sums.append(s)
            means.append(s / len(pos))
    if mode == "token-mean":
        return sum(sums) / n_tok * dp_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        out = sum(sums) / n_seq * dp_size
        return out / c if mode == "seq-mean-token-sum-norm" else out
    if mode == "seq-mean-token-mean":
        return sum(means) / n_seq * dp_size
    if mode == "token-sum":
        return sum(sums)
    raise ValueError(mode)


@st.composite
def wide_cases(draw: st.DrawFn) -> Case:
    """Cases whose reference log-probs are far from the policy's too, so verl's k3 clamps are exercised."""
    case = draw(cases())
    scale = draw(st.sampled_from([1.0, 30.0]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    case.ref = case.logp + scale * torch.randn(case.logp.shape, generator=g, dtype=torch.float64)
    return case


@settings(max_examples=60, deadline=None)
@given(case=wide_cases(), kind=st.sampled_from(KL_NAMES))
def test_kl_value_and_gradient_match_verl(case: Case, kind: KLPenalty) -> None:
    logp = case.logp.clone().requires_grad_(True)
    value = kl_estimate(logp, case.ref, kind)
    (grad,) = torch.autograd.grad(torch.where(case.mask, value, 0.0).sum(), logp)
    value = value.detach()
    m, lp, rp = ref.bools(case.mask), ref.rows(case.logp), ref.rows(case.ref)
    for i in range(len(m)):
        for t in range(len(m[i])):
            if not m[i][t]:
                assert grad[i, t] == 0.0
                continue
            expected = ref.kl_value(lp[i][t], rp[i][t], str(kind))
            assert float(value[i, t]) == pytest.approx(expected, rel=1e-9, abs=1e-9)
            assert float(grad[i, t]) == pytest.approx(ref.kl_grad(lp[i][t], rp[i][t], str(kind)), abs=1e-9)
            if kind.base in (KLPenalty.K3, KLPenalty.LOW_VAR_KL):
                assert abs(float(value[i, t])) <= 10.0 and math.isfinite(float(grad[i, t]))


@settings(max_examples=60, deadline=None)
@given(
    case=cases(max_batch=8),
    mode=st.sampled_from(list(LossAggMode)),
    ranks=st.sampled_from([1, 2]),
    micro=st.sampled_from([1, 2]),
)
def test_aggregation_over_ranks_and_micro_batches_matches_verl(
    case: Case, mode: LossAggMode, ranks: int, micro: int
) -> None:
    # quartet's contract: per-micro-batch share with global counts, times the world size before backward
    # (engines/engine.py); verl's: agg_loss with global counts and dp_size. Same number per micro-batch.
    rows_ = torch.arange(case.mask.shape[0])
    n_tok, n_seq = max(count_valid_tokens(case.mask), 1), max(count_valid_sequences(case.mask), 1)
    c = float(case.mask.shape[1])
    dp = ranks if mode is not LossAggMode.TOKEN_SUM else 1  # verl's token-sum: checked without data parallel
    for rank_rows in rows_.chunk(dp):
        for mb in rank_rows.chunk(micro):
            ours = aggregate_loss(
                case.values[mb],
                case.mask_arg[mb],
                mode,
                global_token_count=n_tok,
                global_seq_count=n_seq,
                norm_constant=c,
            )
            theirs = verl_agg(
                ref.rows(case.values[mb]), ref.bools(case.mask[mb]), str(mode), dp, n_tok, n_seq, c
            )
            assert float(ours) * dp == pytest.approx(theirs, rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(case=wide_cases(), kind=st.sampled_from(KL_NAMES), mode=st.sampled_from(list(LossAggMode)))
def test_kl_loss_term_matches_verl(case: Case, kind: KLPenalty, mode: LossAggMode) -> None:
    out = kl_loss_term(case.logp, case.ref, case.mask_arg, kind, coef=0.2, agg_mode=mode)
    m, lp, rp = ref.bools(case.mask), ref.rows(case.logp), ref.rows(case.ref)
    kl = [
        [ref.kl_value(a, b, str(kind)) for a, b in zip(ra, rb, strict=True)]
        for ra, rb in zip(lp, rp, strict=True)
    ]
    n_tok = max(sum(map(sum, m)), 1)
    n_seq = max(sum(any(r) for r in m), 1)
    expected = verl_agg(kl, m, str(mode), 1, n_tok, n_seq, float(len(m[0])))
    assert float(out.loss) == pytest.approx(0.2 * expected, rel=1e-9, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(case=cases(), kind=st.sampled_from(KL_NAMES))
def test_kl_in_reward_matches_verl_on_rows_with_tokens(case: Case, kind: KLPenalty) -> None:
    # verl: r = score - beta * k on valid tokens; batch KL = mean over ALL rows of each row's token mean.
    # quartet departs for rows without a valid token (they are left out of the mean): compare on the others.
    keep = case.mask.any(dim=-1)
    if not bool(keep.any()):
        return
    mask, scores, old, rp = case.mask[keep], case.rewards[keep], case.old[keep], case.ref[keep]
    out = apply_kl_penalty(scores, old, rp, mask, coef=0.1, kind=kind)
    m, s, o, r = ref.bools(mask), ref.rows(scores), ref.rows(old), ref.rows(rp)
    per_row = []
    for i in range(len(m)):
        ks = []
        for t in range(len(m[i])):
            if m[i][t]:
                k = ref.kl_value(o[i][t], r[i][t], str(kind))
                ks.append(k)
                assert float(out.token_level_rewards[i, t]) == pytest.approx(s[i][t] - 0.1 * k, abs=1e-9)
        per_row.append(sum(ks) / len(ks))
    assert out.current_kl == pytest.approx(sum(per_row) / len(per_row), rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    case=cases(),
    loss_type=st.sampled_from([PolicyLoss.PPO, PolicyLoss.GSPO]),
    mode=st.sampled_from(VERL_MODES),
)
def test_policy_losses_match_verl(case: Case, loss_type: PolicyLoss, mode: LossAggMode) -> None:
    # verl 0.9.1 aggregates both vanilla PPO and GSPO with the configured loss_agg_mode.
    clip = ClipParams(0.2, 0.28, 3.0 if loss_type is PolicyLoss.PPO else 0.0)
    out = compute_policy_loss(
        loss_type, case.logp, case.old, case.adv, case.mask_arg, agg_mode=mode, clip=clip
    )
    lp, old, adv, m = ref.rows(case.logp), ref.rows(case.old), ref.rows(case.adv), ref.bools(case.mask)
    if loss_type is PolicyLoss.PPO:
        tokens, _ = ref.ppo_tokens(lp, old, adv, m, 0.2, 0.28, 3.0)
    else:
        tokens = ref.gspo_tokens(lp, old, adv, m, 0.2, 0.28)
    n_tok = max(sum(map(sum, m)), 1)
    n_seq = max(sum(any(r) for r in m), 1)
    expected = verl_agg(tokens, m, str(mode), 1, n_tok, n_seq, float(len(m[0])))
    assert float(out.loss) == pytest.approx(expected, rel=1e-7, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    coef=st.floats(0.0, 1.0),
    updates=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 200)), min_size=1, max_size=8),
)
def test_adaptive_controller_matches_verl_above_its_floor(
    coef: float, updates: list[tuple[float, int]]
) -> None:
    # Ziegler et al.: beta *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon (verl's rule); quartet
    # keeps beta >= min_coef (a departure: verl's beta stays 0 once 0, and changes sign below a factor 0).
    floor = 1e-4
    ctrl = AdaptiveKLController(coef, target_kl=0.1, horizon=20, min_coef=floor)
    verl_beta = coef  # verl's own trajectory, never floored
    expected = coef  # verl's rule applied to quartet's previous value, then floored
    floored = False
    for kl, n in updates:
        factor = 1.0 + min(max(kl / 0.1 - 1.0, -0.2), 0.2) * n / 20
        verl_beta *= factor
        floored = floored or expected * factor < floor
        expected = max(floor, expected * factor)
        ctrl.update(kl, n)
        assert ctrl.value >= floor
        assert ctrl.value == pytest.approx(expected, rel=1e-12)
        if not floored:  # the floor has never bitten: verl's coefficient exactly
            assert ctrl.value == pytest.approx(verl_beta, rel=1e-12)
