"""DAPO dynamic sampling in the driver, and the padding that joins rollouts of different widths."""

from __future__ import annotations

import torch

from quartet.core.batch import Batch
from quartet.rollout.batch_io import concat_rollouts, pad_rollout
from quartet.trainer.feed.dynamic_sampling import fill_informative_groups

PAD = 9


def _rollout(prompt_lens: list[int], response_lens: list[int], scores: list[float], tag: str) -> Batch:
    """A scored rollout: left-padded prompts of ids 1.., right-padded responses of ids 100.. (one group
    per 2 rows), the score on the last response token."""
    p, r = max(prompt_lens), max(response_lens)
    rows = len(prompt_lens)
    prompts = torch.full((rows, p), PAD)
    responses = torch.full((rows, r), PAD)
    mask = torch.zeros(rows, p + r, dtype=torch.int64)
    response_mask = torch.zeros(rows, r, dtype=torch.int64)
    token_scores = torch.zeros(rows, r)
    for i, (pl, rl) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, p - pl :] = torch.arange(1, pl + 1)
        responses[i, :rl] = torch.arange(100, 100 + rl)
        mask[i, p - pl : p + rl] = 1
        response_mask[i, :rl] = 1
        token_scores[i, rl - 1] = scores[i]
    columns = {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": mask,
        "response_mask": response_mask,
        "token_level_scores": token_scores,
        "scores": torch.tensor(scores),
    }
    uids = [f"{tag}-{i // 2}" for i in range(rows)]
    return Batch(columns, {"uid": uids}, batch_size=rows)


def _real_tokens(batch: Batch, row: int) -> tuple[list[int], list[int]]:
    p = batch["prompts"].shape[1]
    mask = batch["attention_mask"][row]
    prompt = batch["prompts"][row][mask[:p] != 0].tolist()
    response = batch["responses"][row][mask[p:] != 0].tolist()
    return prompt, response


def test_pad_rollout_keeps_every_real_token_and_score() -> None:
    batch = _rollout([2, 3], [1, 2], [1.0, 0.5], "a")
    wide = pad_rollout(batch, 5, 4, PAD)
    assert wide["prompts"].shape == (2, 5) and wide["responses"].shape == (2, 4)
    assert wide["attention_mask"].shape == (2, 9)
    for row in range(2):
        assert _real_tokens(wide, row) == _real_tokens(batch, row)
    assert torch.equal(wide["token_level_scores"].sum(-1), batch["token_level_scores"].sum(-1))
    assert int(wide["response_mask"].sum()) == int(batch["response_mask"].sum())
    assert (wide["responses"][:, 2:] == PAD).all() and (wide["prompts"][:, :2] == PAD).all()


def test_concat_rollouts_of_different_widths_in_order() -> None:
    a = _rollout([2, 2], [1, 1], [0.0, 1.0], "a")
    b = _rollout([4, 1], [3, 2], [1.0, 1.0], "b")
    joined = concat_rollouts([a, b], PAD)
    assert len(joined) == 4
    expected = [_real_tokens(a, 0), _real_tokens(a, 1), _real_tokens(b, 0), _real_tokens(b, 1)]
    assert [_real_tokens(joined, i) for i in range(4)] == expected
    assert list(joined.non_tensors["uid"]) == ["a-0", "a-0", "b-0", "b-0"]


def test_fill_draws_until_enough_informative_groups() -> None:
    # 2 groups of 2: group 0 informative (0 vs 1), group 1 uniform (1, 1)
    first = _rollout([2, 2, 3, 3], [1, 2, 1, 1], [0.0, 1.0, 1.0, 1.0], "d0")
    draws: list[int] = []

    def more(k: int) -> Batch:
        draws.append(k)
        return _rollout([4, 4, 1, 1], [3, 3, 2, 2], [0.0, 0.0, 1.0, 0.0], f"d{k}")  # group 1 informative

    batch, metrics = fill_informative_groups(first, 2, 2, more, max_batches=4, pad_token_id=PAD)
    assert draws == [1]
    assert list(batch.non_tensors["uid"]) == ["d0-0", "d0-0", "d1-1", "d1-1"]
    assert batch["scores"].tolist() == [0.0, 1.0, 1.0, 0.0]
    assert metrics["dynamic_sampling/kept_groups"] == 2
    assert metrics["dynamic_sampling/dropped_groups"] == 2
    assert metrics["dynamic_sampling/gen_batches"] == 2
    assert metrics["dynamic_sampling/padded_groups"] == 0


def test_fill_pads_with_dropped_groups_when_draws_run_out() -> None:
    uniform = [1.0, 1.0, 0.0, 0.0]
    first = _rollout([2, 2, 2, 2], [1, 1, 1, 1], uniform, "d0")
    calls: list[int] = []

    def more(k: int) -> Batch:
        calls.append(k)
        return _rollout([2, 2, 2, 2], [1, 1, 1, 1], uniform, f"d{k}")

    batch, metrics = fill_informative_groups(first, 2, 2, more, max_batches=3, pad_token_id=PAD)
    assert calls == [1, 2]  # stops at max_batches generation batches
    assert len(batch) == 4  # still the batch size the mini-batch split needs
    assert metrics["dynamic_sampling/kept_groups"] == 0
    assert metrics["dynamic_sampling/padded_groups"] == 2
    assert metrics["dynamic_sampling/gen_batches"] == 3
