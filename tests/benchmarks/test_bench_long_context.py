"""The long-context benchmark's rows (benchmarks/long_context.py): long counting-task responses, padded as
the engine expects, with GRPO advantages ordered by how early each response slips."""

from __future__ import annotations

from typing import Any

import torch
from long_context import GROUP, ROWS, _slipped, long_rows

from quartet.tasks.counting import compute_score


def test_slip_replaces_one_integer() -> None:
    assert _slipped("5 6 7 8", 0.5) == "5 6 0 8" and _slipped("5 6 7 8", 1.0) == "5 6 7 8"
    assert compute_score(_slipped("5 6 7 8", 0.5), "5..8") == 0.5


def test_long_rows_are_long_and_graded(chat_tokenizer: Any) -> None:
    batch = long_rows(chat_tokenizer, 4096, seed=0)  # room for every default run: nothing is cut
    lengths = batch["response_mask"].sum(1)
    assert len(batch) == ROWS and int(lengths.min()) > 600
    # left-padded prompts, right-padded responses, the mask over both
    assert torch.equal(batch["attention_mask"][:, -4096:], batch["response_mask"])
    assert bool((batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(1) > 20).all())
    adv = batch["advantages"][:, 0].reshape(ROWS // GROUP, GROUP)
    assert bool((adv[:, :-1] > adv[:, 1:]).all())  # the later the slip, the higher the reward
    torch.testing.assert_close(adv.mean(1), torch.zeros(ROWS // GROUP), atol=1e-6, rtol=0)
    cut = long_rows(chat_tokenizer, 512, seed=0)
    assert int(cut["response_mask"].sum(1).max()) == 512
