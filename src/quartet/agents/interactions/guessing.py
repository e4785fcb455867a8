"""A number-guessing game: the simulated user hides an integer and answers each guess "Higher." or "Lower."

Per trajectory (the row's `extra_info.interaction_kwargs`): `target`, `low` and `high`, integers with
`low <= target <= high` (the range is inclusive), and optionally `announce_range` (a bool) and
`max_guesses` (a positive integer), each defaulting to the interaction's own setting. The model's guess is
the LAST integer in its turn's text (`-?[0-9]+`, a minus only where it does not follow a letter or digit, so
"3-5" reads as 5), which lets it reason before answering. Each assistant turn is one guess:

    right number                       -> done, score 1.0, content ""
    wrong number, guesses left         -> HIGHER or LOWER (an out-of-range guess is just a wrong guess)
    no integer (or over 4000 digits)   -> INVALID, counted as a guess
    `max_guesses` used up, still wrong -> done, score 0.0, content ""

A user that announces the range (`announce_range`) adds the range its answers so far leave open to each
"Higher."/"Lower.": "Higher. It is from 17 to 32." (`answer_text`): the game's state stands in the last
message, so a player need not recompute it from the whole history.

Metrics on every reply, counted over the trajectory so far: `interaction/guesses` and
`interaction/invalid`, so the last reply's metrics sum up the game.

Turn-level credit (`consistent_guess_reward`, 0 by default): a guess that lies in the range the answers so
far leave open (e.g. after "Higher." to 50, anything above 50 up to the last "Lower.") earns that reward
for its turn alone (`InteractionReply.turn_reward`); an inconsistent or invalid guess earns 0. It rewards
using the user's answers, which the final score alone only does through the game's outcome.

The default `max_guesses=7` is what a perfect binary search needs on 1..100 (floor(log2(100)) + 1).
`optimal_guess` and `binary_search_transcript` give that player's moves, for writing SFT traces.
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from quartet.agents.interaction import Interaction, InteractionError, InteractionReply

__all__ = [
    "HIGHER",
    "INVALID",
    "LOWER",
    "GuessingGameInteraction",
    "answer_text",
    "binary_search_transcript",
    "last_integer",
    "narrowed_range",
    "optimal_guess",
]

HIGHER = "Higher."
"""The reply when the target is above the guess."""
LOWER = "Lower."
"""The reply when the target is below the guess."""
INVALID = "Please answer with a single number."
"""The reply when the turn holds no integer."""

_INTEGER = re.compile(r"(?:(?<![A-Za-z0-9])-)?[0-9]+")
_MAX_DIGITS = 4000  # Python refuses int() on strings past 4300 digits
_KWARGS = ("target", "low", "high")
_OPTIONAL_KWARGS = ("announce_range", "max_guesses")
_WHERE = "the row's extra_info.interaction_kwargs"


def last_integer(text: str) -> int | None:
    """The last integer written in `text`, or None when there is none (or it has over 4000 digits)."""
    matches = _INTEGER.findall(text)
    if not matches:
        return None
    last: str = matches[-1]
    if len(last.lstrip("-").lstrip("0")) > _MAX_DIGITS:
        return None
    return int(last)


def narrowed_range(open_low: int, open_high: int, guess: int, target: int) -> tuple[int, int]:
    """The range left open after the answer to a wrong `guess` (one outside the range narrows nothing)."""
    if guess < target:
        return max(open_low, guess + 1), open_high
    return open_low, min(open_high, guess - 1)


def answer_text(guess: int, target: int, open_low: int, open_high: int, announce_range: bool) -> str:
    """The user's answer to a wrong `guess`: HIGHER or LOWER, and with `announce_range` the range still
    open after it (`open_low..open_high`, the guess already applied)."""
    direction = HIGHER if guess < target else LOWER
    return f"{direction} It is from {open_low} to {open_high}." if announce_range else direction


def optimal_guess(low: int, high: int) -> int:
    """The binary-search guess for a target in the inclusive range [low, high]: the midpoint, rounded down."""
    if low > high:
        raise ValueError(f"empty range: low={low} > high={high}")
    return (low + high) // 2


def binary_search_transcript(target: int, low: int, high: int) -> list[int]:
    """The guesses a perfect binary-search player makes for `target` in [low, high], the last one right."""
    if not low <= target <= high:
        raise ValueError(f"target {target} is outside [{low}, {high}]")
    guesses: list[int] = []
    while True:
        guess = optimal_guess(low, high)
        guesses.append(guess)
        if guess == target:
            return guesses
        if guess < target:
            low = guess + 1
        else:
            high = guess - 1


@dataclass
class _Game:
    """One trajectory's game; mutated as guesses come in."""

    target: int
    low: int
    high: int
    guesses: int = 0
    invalid: int = 0
    over: bool = False
    open_low: int = 0
    open_high: int = 0
    """The range the answers so far leave open (set from low/high at start)."""
    announce_range: bool = False
    max_guesses: int = 7


def _integer_kwarg(kwargs: dict[str, Any], key: str) -> int:
    if key not in kwargs:
        raise InteractionError(
            f"guessing game: missing {key!r}; set target, low and high (integers) in {_WHERE}"
        )
    value = kwargs[key]
    # numbers.Integral admits numpy integers read from parquet; bool is an int subclass but not a number here
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InteractionError(
            f"guessing game: {key!r} must be an integer, got {value!r}; fix it in {_WHERE}"
        )
    return int(value)


class GuessingGameInteraction(Interaction):
    """The number-guessing user (module docstring): "Higher."/"Lower." until right or out of guesses."""

    default_name = "guessing_game"

    def __init__(
        self,
        *,
        max_guesses: int = 7,
        consistent_guess_reward: float = 0.0,
        announce_range: bool = False,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or max_guesses < 1:
            raise InteractionError(f"max_guesses must be a positive integer, got {max_guesses!r}")
        if isinstance(consistent_guess_reward, bool) or not isinstance(consistent_guess_reward, int | float):
            raise InteractionError(
                f"consistent_guess_reward must be a number, got {consistent_guess_reward!r}"
            )
        if not isinstance(announce_range, bool):
            raise InteractionError(f"announce_range must be true or false, got {announce_range!r}")
        self.max_guesses = max_guesses
        self.announce_range = announce_range
        self.consistent_guess_reward = float(consistent_guess_reward)
        self._games: dict[str, _Game] = {}

    async def start(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """A new game for `target` in [low, high]; `InteractionError` naming the kwarg when one is wrong."""
        unknown = sorted(set(kwargs) - set(_KWARGS) - set(_OPTIONAL_KWARGS))
        if unknown:
            raise InteractionError(
                f"guessing game: unknown kwargs {unknown}; only target, low, high, announce_range and"
                f" max_guesses are read from {_WHERE}"
            )
        target, low, high = (_integer_kwarg(kwargs, key) for key in _KWARGS)
        announce, max_guesses = self._options(kwargs)
        if low > high:
            raise InteractionError(
                f"guessing game: 'low' ({low}) > 'high' ({high}); fix the range in {_WHERE}"
            )
        if not low <= target <= high:
            raise InteractionError(
                f"guessing game: 'target' ({target}) is outside [low, high] = [{low}, {high}];"
                f" fix it in {_WHERE}"
            )
        instance_id = await super().start(instance_id, target=target, low=low, high=high)
        self._games[instance_id] = _Game(
            target, low, high, open_low=low, open_high=high, announce_range=announce, max_guesses=max_guesses
        )
        return instance_id

    def _options(self, kwargs: dict[str, Any]) -> tuple[bool, int]:
        """(announce_range, max_guesses) of one game: the row's kwargs, else this interaction's settings (a
        None is a gap in a parquet struct column, i.e. not set)."""
        announce = kwargs.get("announce_range")
        announce = self.announce_range if announce is None else announce
        if not isinstance(announce, bool | np.bool_):
            raise InteractionError(
                f"guessing game: 'announce_range' must be true or false, got {announce!r}; fix it in {_WHERE}"
            )
        if kwargs.get("max_guesses") is None:
            return bool(announce), self.max_guesses
        max_guesses = _integer_kwarg(kwargs, "max_guesses")
        if max_guesses < 1:
            raise InteractionError(
                f"guessing game: 'max_guesses' must be >= 1, got {max_guesses}; fix it in {_WHERE}"
            )
        return bool(announce), max_guesses

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        """Judge the guess in the last (assistant) message; see the module docstring for the replies."""
        game = self._games.get(instance_id)
        if game is None:
            raise InteractionError(f"guessing game: no instance {instance_id!r}; call start() first")
        if game.over:
            raise InteractionError(f"guessing game: instance {instance_id!r} is over; call finish()")
        if not messages or messages[-1].get("role") != "assistant":
            raise InteractionError("guessing game: respond() needs the assistant's turn as the last message")
        content = messages[-1].get("content")
        guess = last_integer(content) if isinstance(content, str) else None
        game.guesses += 1
        game.invalid += guess is None
        metrics = {"interaction/guesses": float(game.guesses), "interaction/invalid": float(game.invalid)}
        consistent = guess is not None and game.open_low <= guess <= game.open_high
        turn = self.consistent_guess_reward if consistent and self.consistent_guess_reward else None
        if guess == game.target:
            game.over = True
            return InteractionReply("", done=True, score=1.0, turn_reward=turn, metrics=metrics)
        if guess is not None:
            game.open_low, game.open_high = narrowed_range(game.open_low, game.open_high, guess, game.target)
        if game.guesses >= game.max_guesses:
            game.over = True
            return InteractionReply("", done=True, score=0.0, turn_reward=turn, metrics=metrics)
        if guess is None:
            return InteractionReply(INVALID, done=False, metrics=metrics)
        reply = answer_text(guess, game.target, game.open_low, game.open_high, game.announce_range)
        return InteractionReply(reply, done=False, turn_reward=turn, metrics=metrics)

    async def finish(self, instance_id: str) -> None:
        """Forget the game (idempotent)."""
        self._games.pop(instance_id, None)
        await super().finish(instance_id)
