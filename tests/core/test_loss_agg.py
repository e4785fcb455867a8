"""Loss aggregation modes against loop references, and micro-batch / full-batch equivalence."""

from __future__ import annotations

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.core.choices import LossAggMode
from quartet.core.loss_agg import aggregate_loss, count_valid_sequences, count_valid_tokens

MODES = list(LossAggMode)


@settings(max_examples=80, deadline=None)
@given(case=cases(), mode=st.sampled_from(MODES), norm=st.sampled_from([None, 16.0]))
def test_modes_match_loop_reference(case: Case, mode: LossAggMode, norm: float | None) -> None:
    out = aggregate_loss(case.values, case.mask_arg, mode, norm_constant=norm)
    expected = ref.aggregate(ref.rows(case.values), ref.bools(case.mask), str(mode), norm=norm)
    assert float(out) == pytest.approx(expected, abs=1e-6)


def test_modes_hand_computed() -> None:
    # row 0: losses 1, 2, (masked 100), 3 -> sum 6 over 3 tokens; row 1: 4 over 1 token; row 2: empty.
    loss = torch.tensor([[1.0, 2.0, 100.0, 3.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    expected = {
        LossAggMode.TOKEN_MEAN: 10 / 4,  # 10 over 4 valid tokens
        LossAggMode.SEQ_MEAN_TOKEN_SUM: (6 + 4) / 2,  # the empty row is not a sequence
        LossAggMode.SEQ_MEAN_TOKEN_MEAN: (6 / 3 + 4 / 1) / 2,
        LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM: (6 + 4) / (4 * 2),  # C = T = 4
        LossAggMode.TOKEN_SUM: 6 + 4,  # no denominator
    }
    for mode, value in expected.items():
        assert float(aggregate_loss(loss, mask, mode)) == pytest.approx(value), mode


@pytest.mark.parametrize("mode", MODES)
def test_four_micro_batches_with_global_counts_equal_one_batch(mode: LossAggMode) -> None:
    g = torch.Generator().manual_seed(0)
    loss_leaf = torch.randn(16, 9, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(16, 9, generator=g) > 0.4
    mask[3] = False
    mask[7, 3:6] = False
    # The micro-batches have different numbers of valid tokens, so local token-means would differ.
    mask[:4, :] = True
    full = aggregate_loss(loss_leaf, mask, mode, norm_constant=9)
    (full_grad,) = torch.autograd.grad(full, loss_leaf)
    n_tok, n_seq = count_valid_tokens(mask), count_valid_sequences(mask)
    parts = [
        aggregate_loss(
            loss_leaf[rows],
            mask[rows],
            mode,
            global_token_count=n_tok,
            global_seq_count=n_seq,
            norm_constant=9,
        )
        for rows in torch.arange(16).chunk(4)
    ]
    total = torch.stack(parts).sum()
    (acc_grad,) = torch.autograd.grad(total, loss_leaf)
    torch.testing.assert_close(total, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(acc_grad, full_grad, rtol=0, atol=1e-12)
    if mode is LossAggMode.TOKEN_MEAN:
        local = torch.stack([aggregate_loss(loss_leaf[r], mask[r], mode) for r in torch.arange(16).chunk(4)])
        assert abs(float(local.mean().detach()) - float(full.detach())) > 1e-6  # why global denominators


def test_empty_micro_batch_gives_zero_with_graph() -> None:
    leaf = torch.randn(2, 3, requires_grad=True)
    for mode in MODES:
        out = aggregate_loss(leaf, torch.zeros(2, 3), mode)
        assert float(out.detach()) == 0.0 and out.requires_grad
        (grad,) = torch.autograd.grad(out, leaf)
        assert torch.all(grad == 0)


def test_nan_in_masked_positions_does_not_leak() -> None:
    leaf = torch.tensor([[1.0, float("nan")], [float("inf"), 2.0]], requires_grad=True)
    mask = torch.tensor([[True, False], [False, True]])
    for mode in MODES:
        out = aggregate_loss(leaf, mask, mode)
        (grad,) = torch.autograd.grad(out, leaf)
        assert torch.isfinite(out) and torch.isfinite(grad).all()


def test_string_value_and_bad_constant() -> None:
    loss, mask = torch.ones(1, 2), torch.ones(1, 2)
    assert float(aggregate_loss(loss, mask, "token-mean")) == 1.0  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        aggregate_loss(loss, mask, "token-total")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate_loss(loss, mask, LossAggMode.SEQ_MEAN_TOKEN_SUM_NORM, norm_constant=0)
