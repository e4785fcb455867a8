"""Micro-batch plans, input trimming and log-prob heads: pure functions against slow definitions."""

from __future__ import annotations

import torch
from engine_cases import make_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from quartet.engines import MicroSpec
from quartet.engines.heads import last_valid_index, response_logprobs, response_values
from quartet.engines.inputs import build_inputs
from quartet.engines.micro import extend_plan, plan_micro_batches, restore_order


def _rows(plan: list[torch.Tensor]) -> list[int]:
    return sorted(torch.cat(plan).tolist()) if plan else []


def test_fixed_plan_is_consecutive_chunks() -> None:
    plan = plan_micro_batches(torch.ones(7, dtype=torch.int64), MicroSpec(size=3))
    assert [p.tolist() for p in plan] == [[0, 1, 2], [3, 4, 5], [6]]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=30),
    budget=st.integers(1, 80),
)
def test_token_plan_is_first_fit_decreasing(lengths: list[int], budget: int) -> None:
    lens = torch.tensor(lengths)
    plan = plan_micro_batches(lens, MicroSpec(max_tokens=budget))
    assert _rows(plan) == list(range(len(lengths)))  # every row exactly once
    loads = [int(lens[p].sum()) for p in plan]
    for p, load in zip(plan, loads, strict=True):
        assert load <= budget or p.numel() == 1  # over budget only when one row alone is
    # First fit: a row placed in bin j did not fit in any earlier bin (whose load only grew since).
    for j, p in enumerate(plan):
        for row in p.tolist():
            assert all(loads[i] + lengths[row] > budget for i in range(j))
    # Decreasing: within a bin rows come longest first.
    for p in plan:
        assert lens[p].tolist() == sorted(lens[p].tolist(), reverse=True)


def test_extend_plan_splits_largest_then_adds_empty() -> None:
    plan = [torch.tensor([0, 1, 2, 3]), torch.tensor([4])]
    out = extend_plan(plan, 3)
    assert [p.tolist() for p in out] == [[0, 1], [2, 3], [4]]
    out = extend_plan([torch.tensor([0])], 3)
    assert [p.tolist() for p in out] == [[0], [], []]


def test_restore_order_inverts_the_plan() -> None:
    values = torch.arange(6.0)[:, None] * torch.ones(1, 3)
    plan = [torch.tensor([4, 1]), torch.tensor([0, 5, 2]), torch.tensor([3])]
    parts = [values[p] for p in plan]
    assert torch.equal(restore_order(parts, plan), values)


def test_build_inputs_trims_shared_padding_and_counts_positions() -> None:
    batch = make_batch([2, 3], [1, 2], prompt_width=6, response_width=5)
    inputs = build_inputs(batch)
    # 3 prompt columns (the longest prompt) + 2 response columns (the longest response) are kept.
    assert inputs.input_ids.shape == (2, 5) and inputs.response_width == 2
    assert inputs.attention_mask.tolist() == [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert inputs.position_ids.tolist() == [[0, 0, 1, 2, 2], [0, 1, 2, 3, 4]]
    assert inputs.response_mask.tolist() == [[True, False], [True, True]]
    untrimmed = build_inputs(batch, trim=False)
    assert untrimmed.input_ids.shape == (2, 11) and untrimmed.response_width == 5


def test_response_logprobs_matches_log_softmax_in_float32() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 17, generator=g).to(torch.bfloat16)
    targets = torch.randint(0, 17, (3, 5), generator=g)
    got = response_logprobs(logits, targets, temperature=0.6, chunk=4)  # chunks cut across rows
    ref = torch.log_softmax(logits.double() / 0.6, dim=-1).gather(-1, targets[..., None]).squeeze(-1)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref, atol=1e-5, rtol=0)


def test_values_are_read_at_the_state_before_each_response_token() -> None:
    token_values = torch.arange(10.0)[None]  # positions 0..9, last 3 are the response
    assert response_values(token_values, 3).tolist() == [[6.0, 7.0, 8.0]]


def test_last_valid_index() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert last_valid_index(mask).tolist() == [2, 3, 0]
