"""Guess the number: a conversation with a simulated user (the `guessing_game` interaction), several turns.

    user: I am thinking of a whole number from 1 to 32. Guess it: answer with one number each turn, and I
          will say Higher. or Lower.
    assistant: 16        user: Higher.        assistant: 24        user: Lower.        assistant: 20  ...

The user is quartet's `GuessingGameInteraction`: each model turn is one guess, the user answers
"Higher."/"Lower." until the guess is right (score 1) or the guesses run out (score 0). The reward is the
interaction's: `compute_score` reads the trajectory's `env_reward` (which the agent loop puts in
`extra_info`), and only without one falls back to checking the final turn against the target.

- RL rows: the opening user message, `agent_name: user_sim`, `extra_info.interaction_kwargs` = {name,
  target, low, high, announce_range}; ground truth = the target. The task's user announces the range its
  answers leave open ("Higher. It is from 17 to 32.", `GuessingSpec.announce_range`, on by default): a
  4-layer model does not learn to recompute that range from the whole history in minutes (measured:
  docs/agentic.md), and a real user can say it. The range is fixed (`low..high`), so the states a player
  meets are the answers so far, not new numbers: validation plays every target of the range once (greedy
  play is then the whole policy, measured), training draws targets at random.
- SFT traces: the binary-search player's conversation for a target (`binary_search_transcript`), with
  `sloppy` of them replaced by a player that guesses at random inside the open range (a weaker but
  consistent start for RL to improve on), drawn among its games that win within `max_guesses`.
- The task's game allows `max_guesses` = 6 (rows carry it): exactly what binary search needs on 1..32
  (floor(log2 32) + 1), so a binary-search player always wins and a random consistent player wins 71% of
  its games (simulated): a gap that the outcome reward alone can teach.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quartet.agents.interactions.guessing import (
    answer_text,
    binary_search_transcript,
    last_integer,
    narrowed_range,
)
from quartet.tasks.rows import RL_FILES, SFT_FILES, ProblemRows, sft_row, write_splits

__all__ = [
    "DATA_SOURCE",
    "GuessingSpec",
    "compute_score",
    "opening",
    "transcript_messages",
    "verify_answer",
    "write_rl_set",
    "write_sft_set",
]

DATA_SOURCE = "guessing"
INTERACTION = "guessing_game"
MAX_GUESSES = 6
"""The task's `max_guesses` (each row's kwarg): binary search on 1..32 needs exactly that many."""


@dataclass(frozen=True)
class GuessingSpec:
    """Targets in the inclusive range `low..high`; `sloppy`: the share of SFT traces from a random (but
    consistent) player instead of the binary-search one; `announce_range`: the user adds the range still
    open to each answer."""

    low: int = 1
    high: int = 32
    sloppy: float = 0.0
    announce_range: bool = True
    max_guesses: int = MAX_GUESSES

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) > high ({self.high})")
        if not 0.0 <= self.sloppy <= 1.0:
            raise ValueError(f"sloppy must lie in [0, 1], got {self.sloppy}")
        if self.max_guesses < 1:
            raise ValueError(f"max_guesses must be >= 1, got {self.max_guesses}")


def opening(spec: GuessingSpec) -> str:
    """The user's first message."""
    return (
        f"I am thinking of a whole number from {spec.low} to {spec.high}. Guess it: answer with one number "
        "each turn, and I will say Higher. or Lower."
    )


def _random_player(target: int, low: int, high: int, rng: random.Random) -> list[int]:
    guesses = []
    while True:
        guess = rng.randint(low, high)
        guesses.append(guess)
        if guess == target:
            return guesses
        low, high = (guess + 1, high) if guess < target else (low, guess - 1)


def transcript_messages(spec: GuessingSpec, guesses: list[int], target: int) -> list[dict[str, str]]:
    """The conversation of `guesses` (the last one right) against `target`."""
    messages = [{"role": "user", "content": opening(spec)}]
    low, high = spec.low, spec.high
    for guess in guesses:
        messages.append({"role": "assistant", "content": str(guess)})
        if guess != target:
            low, high = narrowed_range(low, high, guess, target)
            reply = answer_text(guess, target, low, high, spec.announce_range)
            messages.append({"role": "user", "content": reply})
    return messages


def verify_answer(response: str, ground_truth: str) -> bool:
    """True when the last integer of `response` (the final turn) is the target."""
    return last_integer(response) == int(ground_truth)


def compute_score(solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None) -> float:
    """The interaction's score (`extra_info["env_reward"]`); without one, 1.0 when the final turn guesses
    the target."""
    if extra_info and extra_info.get("env_reward") is not None:
        return float(extra_info["env_reward"])
    final = extra_info.get("final_message") if extra_info else None
    text = final if isinstance(final, str) else solution_str
    return 1.0 if verify_answer(text, ground_truth) else 0.0


def _targets(spec: GuessingSpec, size: int, rng: random.Random) -> list[int]:
    return [rng.randint(spec.low, spec.high) for _ in range(size)]


def rl_rows(spec: GuessingSpec, targets: Iterable[int], split: str) -> list[dict[str, Any]]:
    """Rows of the RL prompt set (verl's layout, `agent_name` = user_sim)."""
    kwargs = {
        "name": INTERACTION,
        "low": spec.low,
        "high": spec.high,
        "announce_range": spec.announce_range,
        "max_guesses": spec.max_guesses,
    }
    rows: ProblemRows[int] = ProblemRows(
        DATA_SOURCE,
        "interaction",
        question=lambda _target: opening(spec),
        answer=str,
        extra=lambda target: {"interaction_kwargs": {**kwargs, "target": target}},
        agent_name="user_sim",
    )
    return rows.rl_rows(targets, split)


def write_rl_set(
    folder: str | Path, spec: GuessingSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """`rl_train.parquet` (random targets) and `rl_val.parquet` (every target of the range, repeated to
    `val_size` rows at least once each)."""
    every = list(range(spec.low, spec.high + 1))
    val = [every[i % len(every)] for i in range(max(val_size, len(every)))]
    train = _targets(spec, train_size, random.Random(seed))
    return write_splits(folder, RL_FILES, rl_rows(spec, train, "train"), rl_rows(spec, val, "val"))


def sft_rows(spec: GuessingSpec, targets: Iterable[int], seed: int) -> list[dict[str, Any]]:
    """Rows of the SFT set: `messages` (a whole game), `ground_truth`, `data_source`."""
    rng = random.Random(seed)
    rows = []
    for target in targets:
        guesses = binary_search_transcript(target, spec.low, spec.high)
        if rng.random() < spec.sloppy:  # a random game that still wins within the interaction's guesses
            games = (_random_player(target, spec.low, spec.high, rng) for _ in range(50))
            guesses = next((g for g in games if len(g) <= spec.max_guesses), guesses)
        rows.append(sft_row(transcript_messages(spec, guesses, target), str(target), DATA_SOURCE))
    return rows


def write_sft_set(
    folder: str | Path, spec: GuessingSpec, train_size: int, val_size: int, seed: int
) -> tuple[Path, Path]:
    """`sft_train.parquet` and `sft_val.parquet`: games for random targets."""
    rng = random.Random(seed + 2)
    train = sft_rows(spec, _targets(spec, train_size, rng), seed)
    val = sft_rows(spec, _targets(spec, val_size, rng), seed + 1)
    return write_splits(folder, SFT_FILES, train, val)
