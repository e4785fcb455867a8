"""A trajectory's routing record across turns: which record a token processed by several engine calls keeps,
how cuts follow the ids, and the batch columns it lands in (against the rule written out by hand)."""

from __future__ import annotations

import pytest
import torch

from quartet.agents.batch import trajectories_to_batch
from quartet.agents.trajectory import Trajectory
from quartet.core.batch import Batch
from quartet.core.routing import ROUTED_EXPERTS


def call_record(tokens: int, mark: int) -> torch.Tensor:
    """A record [tokens, 2, 2] whose every value names the call (`mark`) and the position."""
    pos = torch.arange(tokens, dtype=torch.int16).view(-1, 1, 1)
    return (pos + 100 * mark).expand(tokens, 2, 2).to(torch.int16).clone()


def two_turns() -> Trajectory:
    """Prompt 4, model turn of 3 (call 1), user turn of 2, model turn of 3 (call 2)."""
    t = Trajectory(prompt_ids=[1, 2, 3, 4], messages=[])
    t.add_model_turn([5, 6, 7], None, routing=call_record(4 + 3 - 1, 1))
    t.add_env_turn("user", [8, 9])
    t.add_model_turn([10, 11, 12], None, routing=call_record(9 + 3 - 1, 2))
    return t


def test_model_tokens_keep_their_decode_and_the_rest_the_latest_prefill() -> None:
    t = two_turns()
    assert t.routing is not None and t.routing.record is not None
    got = t.routing.record[:, 0, 0].tolist()
    # positions 4, 5: turn 1's tokens fed by its decode steps; 6 (its last token), the prompt and the user
    # turn: call 2's prefill; 9, 10: turn 2's decode steps; 11 (the last token) has none
    want = [200, 201, 202, 203, 104, 105, 206, 207, 208, 209, 210]
    assert got == want


def test_cuts_forget_what_follows_and_a_lost_record_stays_lost() -> None:
    t = two_turns()
    t.truncate(6)  # the response cut to 6 tokens: positions 0..9 remain
    assert t.routing is not None and t.routing.covered == 10
    rebased = two_turns()
    rebased.rebase([1, 2, 3, 4, 5, 6, 99], "user")  # a re-render that differs at position 6
    assert rebased.routing is not None and rebased.routing.covered == 6
    lost = Trajectory(prompt_ids=[1, 2], messages=[])
    lost.add_model_turn([3, 4], None, routing=call_record(3, 1))
    lost.add_model_turn([5], None)  # a call that returned no record
    lost.add_model_turn([6, 7], None, routing=call_record(6, 2))
    assert lost.routing is None and lost.routing_lost
    with pytest.raises(ValueError, match="expected"):
        Trajectory(prompt_ids=[1, 2], messages=[]).add_model_turn([3], None, routing=call_record(5, 1))


def test_the_batch_lays_records_over_left_padded_prompts_and_right_padded_responses() -> None:
    short = Trajectory(prompt_ids=[1, 2], messages=[])
    short.add_model_turn([3, 4], None, routing=call_record(3, 3))
    prompts = Batch({"prompts": torch.ones(2, 1, dtype=torch.int64), "attention_mask": torch.ones(2, 1)})
    batch = trajectories_to_batch(prompts, [two_turns(), short], 1, 0, response_width=10)
    column = batch[ROUTED_EXPERTS][:, :, 0, 0]
    assert column.shape == (2, 4 + 10)
    assert column[0].tolist() == [200, 201, 202, 203, 104, 105, 206, 207, 208, 209, 210, 0, 0, 0]
    assert column[1].tolist() == [0, 0, 300, 301, 302, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    lost = Trajectory(prompt_ids=[1, 2], messages=[])
    lost.add_model_turn([3, 4], None)
    with pytest.raises(ValueError, match="routing=out.routed_experts"):
        trajectories_to_batch(prompts, [two_turns(), lost], 1, 0, response_width=10)
