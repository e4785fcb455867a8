"""Policy losses (PPO with asymmetric and dual clip, GSPO, REINFORCE, TIS) against loop references."""

from __future__ import annotations

import math

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases, multi_turn_case
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.choices import LossAggMode, PolicyLoss
from quartet.core.loss_agg import count_valid_sequences, count_valid_tokens
from quartet.core.metrics import (
    PG_CLIPFRAC,
    PG_CLIPFRAC_DUAL,
    PG_CLIPFRAC_HIGH,
    PG_CLIPFRAC_LOW,
    PG_LOSS,
    PPO_KL,
    PPO_KL_K3,
    TIS_CLIPFRAC,
    TIS_WEIGHT_MEAN,
)
from quartet.core.policy_loss import (
    POLICY_LOSSES,
    ClipParams,
    compute_policy_loss,
    masked_importance_weights,
    truncated_importance_weights,
)

TOL = 1e-6
MODES = list(LossAggMode)


def scalar_close(actual: torch.Tensor, expected: float) -> None:
    value = float(actual.detach())
    assert value == pytest.approx(expected, abs=TOL), (value, expected)


def test_every_policy_loss_has_a_function() -> None:
    assert set(POLICY_LOSSES) == set(PolicyLoss)


@settings(max_examples=80, deadline=None)
@given(
    case=cases(),
    mode=st.sampled_from(MODES),
    low=st.sampled_from([0.1, 0.2]),
    high=st.sampled_from([0.2, 0.28]),
    dual=st.sampled_from([0.0, 1.5, 3.0]),
    tis_cap=st.sampled_from([0.0, 1.2, 2.0]),
)
def test_ppo_matches_loop_reference(
    case: Case, mode: LossAggMode, low: float, high: float, dual: float, tis_cap: float
) -> None:
    check_ppo(case, mode, low, high, dual, tis_cap)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("float_mask", [False, True])
def test_ppo_on_fixed_multi_turn_batch(mode: LossAggMode, float_mask: bool) -> None:
    case = multi_turn_case(float_mask, seed=1)
    check_ppo(case, mode, 0.2, 0.28, 3.0, 1.5)
    check_ppo(case, mode, 0.1, 0.1, 0.0, 0.0)


def check_ppo(case: Case, mode: LossAggMode, low: float, high: float, dual: float, tis_cap: float) -> None:
    logp = case.logp.clone().requires_grad_(True)
    out = compute_policy_loss(
        PolicyLoss.PPO,
        logp,
        case.old,
        case.adv,
        case.mask_arg,
        agg_mode=mode,
        clip=ClipParams(low, high, dual),
        rollout_logprob=case.rollout,
        tis_cap=tis_cap,
    )
    m = ref.bools(case.mask)
    losses, metrics = ref.ppo_tokens(
        ref.rows(case.logp), ref.rows(case.old), ref.rows(case.adv), m, low, high, dual
    )
    if tis_cap > 0:
        w = ref.tis_weights(ref.rows(case.old), ref.rows(case.rollout), m, tis_cap)
        losses = [[a * b for a, b in zip(lr, wr, strict=True)] for lr, wr in zip(losses, w, strict=True)]
        scalar_close(out.metrics[TIS_WEIGHT_MEAN], ref.masked_token_mean(w, m))
    else:
        assert TIS_WEIGHT_MEAN not in out.metrics
    scalar_close(out.loss, ref.aggregate(losses, m, str(mode)))
    assert float(out.metrics[PG_LOSS]) == float(out.loss.detach())
    scalar_close(out.metrics[PG_CLIPFRAC_HIGH], metrics["high"])
    scalar_close(out.metrics[PG_CLIPFRAC_LOW], metrics["low"])
    scalar_close(out.metrics[PG_CLIPFRAC], metrics["high"] + metrics["low"])
    scalar_close(out.metrics[PG_CLIPFRAC_DUAL], metrics["dual"])
    scalar_close(out.metrics[PPO_KL], metrics["kl"])
    scalar_close(out.metrics[PPO_KL_K3], metrics["kl3"])
    out.loss.backward()
    assert logp.grad is not None and torch.all(logp.grad[~case.mask] == 0)
    assert all(not v.requires_grad for v in out.metrics.values())


@settings(max_examples=60, deadline=None)
@given(case=cases(), mode=st.sampled_from(MODES), clip=st.sampled_from([(3e-4, 4e-4), (0.2, 0.28)]))
def test_gspo_matches_loop_reference(case: Case, mode: LossAggMode, clip: tuple[float, float]) -> None:
    adv = case.adv[:, :1].expand_as(case.adv)  # GSPO is used with sequence-level advantages
    out = compute_policy_loss(
        PolicyLoss.GSPO, case.logp, case.old, adv, case.mask_arg, agg_mode=mode, clip=ClipParams(*clip)
    )
    m = ref.bools(case.mask)
    losses = ref.gspo_tokens(ref.rows(case.logp), ref.rows(case.old), ref.rows(adv), m, *clip)
    scalar_close(out.loss, ref.aggregate(losses, m, str(mode)))
    assert float(out.metrics[PG_CLIPFRAC_DUAL]) == 0


@settings(max_examples=40, deadline=None)
@given(case=cases())
def test_gspo_gradient_is_the_sequence_objective_gradient(case: Case) -> None:
    # The paper's objective written at the sequence level, differentiated by autograd, must give the same
    # gradient as the GSPO-token losses aggregated with seq-mean-token-mean.
    clip = ClipParams(0.1, 0.15)
    adv_row = case.adv[:, 0]
    logp = case.logp.clone().requires_grad_(True)
    out = compute_policy_loss(
        PolicyLoss.GSPO,
        logp,
        case.old,
        adv_row.unsqueeze(-1).expand_as(logp),
        case.mask_arg,
        agg_mode=LossAggMode.SEQ_MEAN_TOKEN_MEAN,
        clip=clip,
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    logp2 = case.logp.clone().requires_grad_(True)
    terms = []
    for i in range(logp2.shape[0]):
        pos = case.mask[i].nonzero().flatten()
        if pos.numel() == 0:
            continue
        s = torch.exp((logp2[i, pos] - case.old[i, pos]).mean())
        terms.append(torch.maximum(-adv_row[i] * s, -adv_row[i] * torch.clamp(s, 0.9, 1.15)))
    if not terms:
        assert torch.all(grad == 0)
        return
    (expected,) = torch.autograd.grad(torch.stack(terms).mean(), logp2)
    torch.testing.assert_close(grad, expected, rtol=0, atol=TOL)


@settings(max_examples=40, deadline=None)
@given(case=cases(), mode=st.sampled_from(MODES))
def test_reinforce_matches_loop_reference(case: Case, mode: LossAggMode) -> None:
    out = compute_policy_loss(
        PolicyLoss.REINFORCE, case.logp, case.old, case.adv, case.mask_arg, agg_mode=mode
    )
    m = ref.bools(case.mask)
    lp, adv = ref.rows(case.logp), ref.rows(case.adv)
    losses = [[-a * p for a, p in zip(ar, pr, strict=True)] for ar, pr in zip(adv, lp, strict=True)]
    scalar_close(out.loss, ref.aggregate(losses, m, str(mode)))
    assert float(out.metrics[PG_CLIPFRAC]) == 0


def hand_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    ratios = [1.5, 0.5, 4.0, 1.1, 9.0]
    logp = torch.tensor([[math.log(r) for r in ratios]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 5, dtype=torch.float64)
    adv = torch.tensor([[1.0, -1.0, -2.0, 0.5, 123.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    return logp, old, adv, mask


def test_ppo_dual_clip_hand_computed() -> None:
    # clip_low 0.2, clip_high 0.28 (clip-higher), dual clip c = 3; ratios r, advantages A, loss per token:
    #   r=1.5, A=+1: max(-1.5, -1.28) = -1.28                   upper clip active
    #   r=0.5, A=-1: max(0.5, 0.8)    = 0.8                     lower clip active
    #   r=4.0, A=-2: max(8, 2.56) = 8, dual: min(8, 2*3) = 6    dual clip active
    #   r=1.1, A=.5: max(-0.55, -0.55) = -0.55                  no clip
    #   5th token masked (A = 123 ignored)
    # token-mean = (-1.28 + 0.8 + 6 - 0.55) / 4 = 1.2425 (without dual clip: 6.97 / 4 = 1.7425)
    # ppo_kl = -mean(log r) = -ln(1.5 * 0.5 * 4 * 1.1) / 4 = -ln(3.3) / 4 = -0.29848
    # d loss / d log r: only the unclipped token moves: -A r / 4 = -0.5 * 1.1 / 4 = -0.1375
    logp, old, adv, mask = hand_batch()
    out = compute_policy_loss(PolicyLoss.PPO, logp, old, adv, mask, clip=ClipParams(0.2, 0.28, 3.0))
    scalar_close(out.loss, 1.2425)
    scalar_close(out.metrics[PG_CLIPFRAC_HIGH], 0.25)
    scalar_close(out.metrics[PG_CLIPFRAC_LOW], 0.25)
    scalar_close(out.metrics[PG_CLIPFRAC], 0.5)
    scalar_close(out.metrics[PG_CLIPFRAC_DUAL], 0.25)
    scalar_close(out.metrics[PPO_KL], -math.log(3.3) / 4)
    out.loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(
        logp.grad, torch.tensor([[0.0, 0.0, 0.0, -0.1375, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12
    )
    no_dual = compute_policy_loss(PolicyLoss.PPO, logp, old, adv, mask, clip=ClipParams(0.2, 0.28, 0.0))
    scalar_close(no_dual.loss, 1.7425)
    assert float(no_dual.metrics[PG_CLIPFRAC_DUAL]) == 0


def test_tis_weights_hand_computed() -> None:
    # exp(old - rollout) = e^1 = 2.718 -> capped at 2; e^-1 = 0.368 kept; masked token weight 1
    old = torch.tensor([[1.0, 0.0, 5.0]])
    rollout = torch.tensor([[0.0, 1.0, 0.0]])
    tis = truncated_importance_weights(old, rollout, torch.tensor([[1, 1, 0]]), cap=2.0)
    torch.testing.assert_close(tis.losses, torch.tensor([[2.0, math.exp(-1.0), 1.0]]))
    scalar_close(tis.metrics[TIS_CLIPFRAC], 0.5)
    with pytest.raises(ValueError):
        truncated_importance_weights(old, rollout, torch.ones(1, 3), cap=0.0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_type", list(PolicyLoss))
def test_four_micro_batches_equal_one_batch(mode: LossAggMode, loss_type: PolicyLoss) -> None:
    g = torch.Generator().manual_seed(3)
    batch, length = 12, 7
    mask = torch.rand(batch, length, generator=g) > 0.35
    mask[5] = False  # an all-masked row
    mask[2, 2:4] = False  # a tool span in the middle
    logp = (-torch.rand(batch, length, generator=g, dtype=torch.float64)).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(batch, length, generator=g, dtype=torch.float64)
    adv = torch.randn(batch, length, generator=g, dtype=torch.float64)
    kwargs = {"agg_mode": mode, "clip": ClipParams(0.2, 0.28, 3.0), "norm_constant": float(length)}
    full = compute_policy_loss(loss_type, logp, old, adv, mask, **kwargs)  # type: ignore[arg-type]
    (full_grad,) = torch.autograd.grad(full.loss, logp)
    n_tok, n_seq = count_valid_tokens(mask), count_valid_sequences(mask)
    total = torch.zeros((), dtype=torch.float64)
    for rows in torch.arange(batch).chunk(4):
        part = compute_policy_loss(
            loss_type,
            logp[rows],
            old[rows],
            adv[rows],
            mask[rows],
            global_token_count=n_tok,
            global_seq_count=n_seq,
            **kwargs,  # type: ignore[arg-type]
        )
        total = total + part.loss
    (acc_grad,) = torch.autograd.grad(total, logp)
    torch.testing.assert_close(total, full.loss, rtol=0, atol=1e-12)
    torch.testing.assert_close(acc_grad, full_grad, rtol=0, atol=1e-12)


def test_clip_params_are_checked() -> None:
    with pytest.raises(ValueError, match="dual_clip_c"):
        ClipParams(dual_clip_c=0.5)
    with pytest.raises(ValueError, match="clip ratios"):
        ClipParams(clip_ratio_low=-0.1)


def test_masked_garbage_does_not_leak() -> None:
    logp, old, adv, mask = hand_batch()
    old = old.clone()
    old[0, 4] = float("nan")
    out = compute_policy_loss(PolicyLoss.PPO, logp, old, adv, mask, clip=ClipParams(0.2, 0.28, 3.0))
    assert math.isfinite(float(out.loss.detach()))
    assert all(math.isfinite(float(v)) for v in out.metrics.values())


def test_masked_is_weights_hand_computed() -> None:
    # ratios e^1 = 2.72 (above the band's top 2: out), e^-1 = 0.37 (below 0.5: out), e^0 = 1 (in), masked 1
    old = torch.tensor([[1.0, 0.0, 2.0, 5.0]])
    rollout = torch.tensor([[0.0, 1.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    weights = masked_importance_weights(old, rollout, mask, low=0.5, high=2.0)
    assert weights.losses.tolist() == [[0.0, 0.0, 1.0, 1.0]]
    scalar_close(weights.metrics[TIS_CLIPFRAC], 2 / 3)
    # in the loss: masked-out tokens contribute nothing, the kept one its plain PPO term
    logp = torch.zeros(1, 4, requires_grad=True)
    adv = torch.ones(1, 4)
    out = compute_policy_loss(
        PolicyLoss.REINFORCE, logp, old, adv, mask, rollout_logprob=rollout, tis_cap=2.0, tis_mask_low=0.5
    )
    (grad,) = torch.autograd.grad(out.loss, logp)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -1 / 3, 0.0]]))  # token-mean over 3 tokens
    with pytest.raises(ValueError):
        masked_importance_weights(old, rollout, mask, low=2.0, high=2.0)
