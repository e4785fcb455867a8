"""The guess-the-number task: RL rows that start the real interaction, validation over the whole range, and
SFT games that the real simulated user plays out exactly as written."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from quartet.agents.interactions.guessing import GuessingGameInteraction
from quartet.tasks.guessing import (
    MAX_GUESSES,
    GuessingSpec,
    compute_score,
    sft_rows,
    write_rl_set,
)


def _replay(messages: list[dict[str, str]], kwargs: dict[str, Any]) -> list[Any]:
    """The real interaction's replies to the game's assistant turns."""
    game = GuessingGameInteraction()

    async def run() -> list[Any]:
        instance = await game.start(**kwargs)
        replies = []
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                replies.append(await game.respond(instance, messages[: i + 1]))
        await game.finish(instance)
        return replies

    return asyncio.run(run())


def test_validation_plays_every_number_and_rows_start_the_real_interaction(tmp_path: Path) -> None:
    spec = GuessingSpec(low=1, high=16)
    train_path, val_path = write_rl_set(tmp_path, spec, 50, 16, seed=0)
    val, train = pq.read_table(val_path).to_pylist(), pq.read_table(train_path).to_pylist()
    targets = sorted(r["extra_info"]["interaction_kwargs"]["target"] for r in val)
    assert targets == list(range(1, 17))
    assert len(train) == 50 and {r["agent_name"] for r in train} == {"user_sim"}
    for row in train[:5]:
        kwargs = dict(row["extra_info"]["interaction_kwargs"])
        assert kwargs.pop("name") == "guessing_game"
        assert str(kwargs["target"]) == row["reward_model"]["ground_truth"]
        replies = _replay([*row["prompt"], {"role": "assistant", "content": str(kwargs["target"])}], kwargs)
        assert replies[-1].done and replies[-1].score == 1.0


@pytest.mark.parametrize("announce", [False, True])
def test_sft_games_are_played_out_by_the_real_user_as_written(announce: bool) -> None:
    for sloppy in (0.0, 1.0):
        spec = GuessingSpec(sloppy=sloppy, announce_range=announce)
        rows = sft_rows(spec, list(range(1, 33)), seed=4)
        lengths = []
        for row in rows:
            messages, target = row["messages"], int(row["ground_truth"])
            kwargs = {"target": target, "low": 1, "high": 32, "announce_range": announce, "max_guesses": 6}
            replies = _replay(messages, kwargs)
            users = [m["content"] for m in messages[1:] if m["role"] == "user"]
            assert [r.content for r in replies[:-1]] == users  # every Higher./Lower. is the user's own
            assert replies[-1].done and replies[-1].score == 1.0  # the last guess wins
            lengths.append(len(replies))
        assert max(lengths) <= MAX_GUESSES
        if sloppy == 0.0:
            assert max(lengths) == 6  # binary search on 1..32: floor(log2 32) + 1
        else:
            firsts = [row["messages"][1]["content"] for row in rows]
            assert sum(first != "16" for first in firsts) > len(rows) // 2  # not the binary-search opening


def test_the_score_is_the_interactions_and_falls_back_to_the_final_guess() -> None:
    assert compute_score("", "7", {"env_reward": 1.0}) == 1.0
    assert compute_score("", "7", {"env_reward": 0.0, "final_message": "7"}) == 0.0  # the user said no
    assert compute_score("", "7", {"env_reward": None, "final_message": "I say 7"}) == 1.0
    assert compute_score("12", "7", None) == 0.0


def test_the_announced_range_is_the_range_left_open() -> None:
    """Each announced range holds exactly the numbers no answer so far has ruled out (brute force)."""
    spec = GuessingSpec(sloppy=1.0)
    for row in sft_rows(spec, list(range(1, 33)), seed=9):
        messages, target = row["messages"], int(row["ground_truth"])
        answered: list[tuple[int, str]] = []
        for guess_msg, reply in zip(messages[1::2], messages[2::2], strict=False):
            answered.append((int(guess_msg["content"]), reply["content"]))
            alive = [
                x
                for x in range(1, 33)
                if all((x > g) if r.startswith("Higher.") else (x < g) for g, r in answered)
            ]
            assert target in alive
            assert reply["content"].endswith(f"It is from {min(alive)} to {max(alive)}.")
