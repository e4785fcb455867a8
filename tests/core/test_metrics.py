"""Masked reductions against loop references, metric names, and the data dashboard."""

from __future__ import annotations

import statistics

import pytest
import reference_algos as ref
import torch
from core_cases import Case, cases
from hypothesis import given, settings

from quartet.core import metrics
from quartet.core.metrics import (
    batch_data_metrics,
    masked_count,
    masked_max,
    masked_mean,
    masked_min,
    masked_std,
    masked_sum,
    masked_var,
)


def valid_values(x: ref.Rows, m: ref.Mask) -> list[float]:
    return [x[i][t] for i in range(len(m)) for t in ref.valid_positions(m[i])]


@settings(max_examples=80, deadline=None)
@given(case=cases())
def test_reductions_match_loop_reference(case: Case) -> None:
    x, m = ref.rows(case.values), ref.bools(case.mask)
    vals = valid_values(x, m)
    mask = case.mask_arg
    assert int(masked_count(mask)) == len(vals)
    assert float(masked_sum(case.values, mask)) == pytest.approx(sum(vals), abs=1e-9)
    assert float(masked_mean(case.values, mask)) == pytest.approx(statistics.fmean(vals) if vals else 0.0)
    assert float(masked_max(case.values, mask)) == (max(vals) if vals else 0.0)
    assert float(masked_min(case.values, mask)) == (min(vals) if vals else 0.0)
    assert float(masked_var(case.values, mask)) == pytest.approx(ref.variance(vals), abs=1e-9)
    assert float(masked_std(case.values, mask)) == pytest.approx(ref.variance(vals) ** 0.5, abs=1e-9)
    biased = statistics.pvariance(vals) if vals else 0.0
    assert float(masked_var(case.values, mask, unbiased=False)) == pytest.approx(biased, abs=1e-9)
    # per row (dim=-1)
    for i, row in enumerate(m):
        row_vals = [x[i][t] for t in ref.valid_positions(row)]
        assert float(masked_mean(case.values, mask, dim=-1)[i]) == pytest.approx(
            statistics.fmean(row_vals) if row_vals else 0.0
        )
        assert float(masked_max(case.values, mask, dim=-1)[i]) == (max(row_vals) if row_vals else 0.0)
        assert float(masked_min(case.values, mask, dim=-1)[i]) == (min(row_vals) if row_vals else 0.0)
        assert float(masked_var(case.values, mask, dim=-1)[i]) == pytest.approx(
            ref.variance(row_vals), abs=1e-9
        )


def test_reductions_ignore_nan_in_padding() -> None:
    x = torch.tensor([[1.0, float("nan")], [float("-inf"), 3.0]])
    mask = torch.tensor([[1, 0], [0, 1]])
    assert float(masked_mean(x, mask)) == 2.0
    assert float(masked_max(x, mask)) == 3.0 and float(masked_min(x, mask)) == 1.0
    assert float(masked_var(x, mask)) == 2.0


def test_standard_names_use_verl_keys() -> None:
    expected = {
        "PG_CLIPFRAC": "actor/pg_clipfrac",
        "PG_CLIPFRAC_DUAL": "actor/pg_clipfrac_lower",
        "PPO_KL": "actor/ppo_kl",
        "ENTROPY": "actor/entropy",
        "PG_LOSS": "actor/pg_loss",
        "KL_LOSS": "actor/kl_loss",
        "VF_LOSS": "critic/vf_loss",
        "VF_CLIPFRAC": "critic/vf_clipfrac",
        "VF_EXPLAINED_VAR": "critic/vf_explained_var",
        "RESPONSE_LENGTH_MEAN": "response_length/mean",
        "ADVANTAGES_MEAN": "critic/advantages/mean",
        "RETURNS_MEAN": "critic/returns/mean",
        "SCORE_MEAN": "critic/score/mean",
        "REWARDS_MEAN": "critic/rewards/mean",
    }
    for name, key in expected.items():
        assert getattr(metrics, name) == key
    names = [n for n in metrics.__all__ if n.isupper()]
    values = [getattr(metrics, n) for n in names]
    assert len(set(values)) == len(values), "two constants share a key"


def test_batch_data_metrics_hand_computed() -> None:
    # 3 responses, T = 4; row 2 has a tool span at positions 1-2. Scores sit on the last valid token.
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 1]])
    scores = torch.tensor([[0.0, 1.0, 0, 0], [0, 0, 0, 0.0], [0, 0, 0, 0.5]])
    rewards = scores - 0.1 * mask  # a KL penalty of 0.1 per valid token
    adv = torch.tensor([[1.0, 2.0, 0, 0], [-1.0, -1.0, -1.0, -1.0], [3.0, 0, 0, 4.0]])
    values = torch.tensor([[0.5, 0.5, 9, 9], [0.0, 0.0, 0.0, 0.0], [1.0, 9, 9, 1.0]])
    out = batch_data_metrics(
        scores,
        rewards,
        adv,
        adv + values,
        mask,
        values=values,
        max_response_length=4,
        prompt_lengths=torch.tensor([3, 8, 8]),
        max_prompt_length=8,
    )
    assert out["critic/score/mean"] == pytest.approx(0.5)
    assert out["critic/score/max"] == 1.0 and out["critic/score/min"] == 0.0
    assert out["critic/rewards/mean"] == pytest.approx((0.8 - 0.4 + 0.3) / 3)
    assert out["critic/advantages/mean"] == pytest.approx(6 / 8)
    assert out["critic/advantages/max"] == 4.0 and out["critic/advantages/min"] == -1.0
    assert out["critic/values/max"] == 1.0  # the 9s sit on masked tokens
    assert out["response_length/mean"] == pytest.approx(8 / 3)
    assert out["response_length/clip_ratio"] == pytest.approx(1 / 3)
    assert out["prompt_length/clip_ratio"] == pytest.approx(2 / 3)
    assert "critic/vf_explained_var" in out
    no_critic = batch_data_metrics(scores, rewards, adv, adv, mask, response_lengths=torch.tensor([2, 4, 4]))
    assert "critic/values/mean" not in no_critic and no_critic["response_length/mean"] == pytest.approx(
        10 / 3
    )
