"""The guessing-game user driven by scripted assistant turns, the base `Interaction`, and the SFT helpers."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest

from quartet.agents.interaction import Interaction, InteractionError, InteractionReply, check_name
from quartet.agents.interactions.guessing import (
    HIGHER,
    INVALID,
    LOWER,
    GuessingGameInteraction,
    binary_search_transcript,
    last_integer,
    optimal_guess,
)


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def _play(game: GuessingGameInteraction, turns: list[str], **kwargs: Any) -> list[InteractionReply]:
    """Start a game, send each scripted assistant turn with the growing conversation, finish."""

    async def run() -> list[InteractionReply]:
        instance = await game.start(**kwargs)
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess my number."}]
        replies = []
        for turn in turns:
            messages.append(_assistant(turn))
            reply = await game.respond(instance, messages)
            replies.append(reply)
            messages.append({"role": "user", "content": reply.content})
        await game.finish(instance)
        return replies

    return asyncio.run(run())


def test_higher_lower_then_correct() -> None:
    replies = _play(
        GuessingGameInteraction(),
        ["My guess is 50.", "Then 25", "Let me think: 30 is too low, so 37.", "37? no: 33"],
        target=33,
        low=1,
        high=100,
    )
    assert [r.content for r in replies] == [LOWER, HIGHER, LOWER, ""]
    assert [r.done for r in replies] == [False, False, False, True]
    assert [r.score for r in replies] == [None, None, None, 1.0]
    assert [r.metrics["interaction/guesses"] for r in replies] == [1.0, 2.0, 3.0, 4.0]
    assert all(r.metrics["interaction/invalid"] == 0.0 for r in replies)
    assert (HIGHER, LOWER, INVALID) == ("Higher.", "Lower.", "Please answer with a single number.")


@pytest.mark.parametrize("where", ["constructor", "row"])
def test_an_announcing_user_says_the_range_still_open(where: str) -> None:
    game = GuessingGameInteraction(announce_range=where == "constructor")
    row = {"announce_range": True} if where == "row" else {}
    replies = _play(game, ["50", "25", "99", "30", "x", "33"], target=33, low=1, high=100, **row)
    assert [r.content for r in replies] == [
        "Lower. It is from 1 to 49.",
        "Higher. It is from 26 to 49.",
        "Lower. It is from 26 to 49.",  # a guess outside the open range does not widen it
        "Higher. It is from 31 to 49.",
        INVALID,
        "",
    ]
    # a row may also switch it off where the interaction announces
    quiet = _play(
        GuessingGameInteraction(announce_range=True), ["5"], target=3, low=1, high=9, announce_range=False
    )
    assert quiet[0].content == LOWER


def test_guesses_inside_the_range_the_answers_left_open_earn_the_turn_reward() -> None:
    turns = ["50", "60", "no idea", "25", "51", "20", "30"]  # target 30 in 1..100
    replies = _play(GuessingGameInteraction(consistent_guess_reward=0.1), turns, target=30, low=1, high=100)
    # 50: open 1..100 -> ok, now 1..49; 60: outside; invalid; 25: ok, now 26..49; 51: outside; 20: outside
    # (below 26); 30: ok and right
    assert [r.turn_reward for r in replies] == [0.1, None, None, 0.1, None, None, 0.1]
    assert replies[-1].done and replies[-1].score == 1.0
    plain = _play(GuessingGameInteraction(), ["50", "30"], target=30, low=1, high=100)
    assert [r.turn_reward for r in plain] == [None, None]  # off by default


def test_invalid_turn_counts_as_a_guess() -> None:
    replies = _play(
        GuessingGameInteraction(max_guesses=3), ["no idea", "seven", "5"], target=5, low=1, high=9
    )
    assert [r.content for r in replies] == [INVALID, INVALID, ""]
    assert [r.metrics["interaction/invalid"] for r in replies] == [1.0, 2.0, 2.0]
    assert [r.metrics["interaction/guesses"] for r in replies] == [1.0, 2.0, 3.0]
    assert replies[-1].done and replies[-1].score == 1.0  # right on the last allowed guess


def test_out_of_guesses_scores_zero() -> None:
    replies = _play(GuessingGameInteraction(max_guesses=3), ["1", "2", "huh"], target=9, low=1, high=9)
    assert [r.content for r in replies] == [HIGHER, HIGHER, ""]
    assert [r.done for r in replies] == [False, False, True]
    assert replies[-1].score == 0.0 and replies[-1].metrics == {
        "interaction/guesses": 3.0,
        "interaction/invalid": 1.0,
    }


def test_out_of_range_and_negative_guesses_are_wrong_guesses() -> None:
    replies = _play(GuessingGameInteraction(), ["500", "-40", "-3"], target=-3, low=-10, high=10)
    assert [r.content for r in replies] == [LOWER, HIGHER, ""]
    assert replies[-1].score == 1.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", 42),
        ("I said 12 before, now 17.", 17),
        ("answer: -8", -8),
        ("(-8)", -8),
        ("between 3-5", 5),  # a hyphen after a digit is not a minus sign
        ("x-5", 5),
        ("007", 7),
        ("no digits here", None),
        ("", None),
        ("9" * 4001, None),  # too long to read
    ],
)
def test_last_integer(text: str, expected: int | None) -> None:
    assert last_integer(text) == expected


def test_two_instances_keep_separate_state() -> None:
    game = GuessingGameInteraction(max_guesses=2)

    async def run() -> tuple[list[InteractionReply], list[InteractionReply]]:
        a = await game.start(target=3, low=1, high=5)
        b = await game.start("row-7", target=4, low=1, high=5)
        assert b == "row-7" and a != b and len(a) == 32  # uuid hex when no id is given
        first = await asyncio.gather(game.respond(a, [_assistant("4")]), game.respond(b, [_assistant("3")]))
        second = [await game.respond(b, [_assistant("4")]), await game.respond(a, [_assistant("1")])]
        return list(first), second

    first, second = asyncio.run(run())
    assert [r.content for r in first] == [LOWER, HIGHER]
    assert second[0].done and second[0].score == 1.0  # b wins on its second guess
    assert second[1].done and second[1].score == 0.0  # a runs out on its second guess
    assert second[1].metrics["interaction/guesses"] == 2.0


def test_finish_is_idempotent_and_forgets() -> None:
    game = GuessingGameInteraction()

    async def run() -> None:
        instance = await game.start(target=1, low=1, high=2)
        assert game.instances[instance] == {"target": 1, "low": 1, "high": 2}
        await game.finish(instance)
        await game.finish(instance)
        await game.finish("never-started")
        assert instance not in game.instances
        with pytest.raises(InteractionError, match="call start"):
            await game.respond(instance, [_assistant("1")])

    asyncio.run(run())


def test_respond_misuse() -> None:
    game = GuessingGameInteraction(max_guesses=1)

    async def run() -> None:
        instance = await game.start(target=1, low=1, high=2)
        with pytest.raises(InteractionError, match="assistant's turn as the last message"):
            await game.respond(instance, [{"role": "user", "content": "1"}])
        with pytest.raises(InteractionError, match="assistant's turn"):
            await game.respond(instance, [])
        assert (await game.respond(instance, [_assistant("2")])).done
        with pytest.raises(InteractionError, match="is over; call finish"):
            await game.respond(instance, [_assistant("1")])

    asyncio.run(run())


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"low": 1, "high": 5}, "missing 'target'"),
        ({"target": 1, "high": 5}, "missing 'low'"),
        ({"target": 1, "low": 1}, "missing 'high'"),
        ({"target": 2.0, "low": 1, "high": 5}, "'target' must be an integer"),
        ({"target": True, "low": 1, "high": 5}, "'target' must be an integer"),
        ({"target": 2, "low": "1", "high": 5}, "'low' must be an integer"),
        ({"target": 2, "low": 5, "high": 1}, "'low' (5) > 'high' (1)"),
        ({"target": 9, "low": 1, "high": 5}, "'target' (9) is outside [low, high] = [1, 5]"),
        ({"target": 2, "low": 1, "high": 5, "hihg": 4}, "unknown kwargs ['hihg']"),
        (
            {"target": 2, "low": 1, "high": 5, "announce_range": "yes"},
            "'announce_range' must be true or false",
        ),
    ],
)
def test_start_rejects_bad_kwargs(kwargs: dict[str, Any], names: str) -> None:
    with pytest.raises(InteractionError) as info:
        asyncio.run(GuessingGameInteraction().start(**kwargs))
    assert names in str(info.value)
    assert "extra_info.interaction_kwargs" in str(info.value)


def test_start_accepts_numpy_integers() -> None:
    game = GuessingGameInteraction()
    replies = _play(game, ["3"], target=np.int64(3), low=np.int32(1), high=np.int64(5))
    assert replies[0].score == 1.0


def test_constructor_checks_and_names() -> None:
    assert GuessingGameInteraction().name == "guessing_game"
    assert GuessingGameInteraction(name="hard_game", max_guesses=3).name == "hard_game"
    assert repr(GuessingGameInteraction()) == "GuessingGameInteraction(name='guessing_game')"
    for bad in (0, -1, True, 2.5):
        with pytest.raises(InteractionError, match="max_guesses must be a positive integer"):
            GuessingGameInteraction(max_guesses=bad)  # type: ignore[arg-type]
    with pytest.raises(InteractionError, match="interaction name"):
        GuessingGameInteraction(name="has space")
    with pytest.raises(InteractionError, match="announce_range must be true or false"):
        GuessingGameInteraction(announce_range="yes")  # type: ignore[arg-type]


class _Echo(Interaction):
    """The smallest interaction: repeats the assistant's turn, ends on 'bye'."""

    default_name = "echo"

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        text = str(messages[-1]["content"])
        return InteractionReply(text, done=text == "bye")


class _Nameless(Interaction):
    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        return InteractionReply("", done=True)


def test_base_interaction_lifecycle() -> None:
    echo = _Echo()

    async def run() -> None:
        instance = await echo.start(secret="x")
        assert echo.instances == {instance: {"secret": "x"}}
        assert await echo.start("mine") == "mine"
        reply = await echo.respond(instance, [_assistant("bye")])
        assert reply == InteractionReply("bye", done=True) and reply.metrics == {} and reply.score is None
        await echo.finish(instance)
        await echo.finish(instance)
        assert list(echo.instances) == ["mine"]

    asyncio.run(run())
    assert echo.name == "echo" and _Nameless(name="quiet").name == "quiet"
    with pytest.raises(InteractionError, match="_Nameless has no default_name; give a name"):
        _Nameless()
    assert check_name("a.b-c_1") == "a.b-c_1"
    for bad in ("", "x" * 65, "a b", None, 3):
        with pytest.raises(InteractionError):
            check_name(bad)


def test_optimal_guess_is_the_floor_midpoint() -> None:
    for low in range(-6, 6):
        for high in range(low, 8):
            assert optimal_guess(low, high) == math.floor((low + high) / 2)
    assert optimal_guess(1, 100) == 50 and optimal_guess(-3, 2) == -1
    with pytest.raises(ValueError, match="empty range"):
        optimal_guess(3, 2)


def _candidate_player(game: GuessingGameInteraction, target: int, low: int, high: int) -> list[int]:
    """An independent binary searcher: keeps the list of numbers still consistent with the replies and
    guesses its lower median; plays against the real game and returns its guesses (the last one right)."""

    async def run() -> list[int]:
        instance = await game.start(target=target, low=low, high=high)
        candidates = list(range(low, high + 1))
        guesses: list[int] = []
        messages: list[dict[str, Any]] = []
        while True:
            guess = candidates[(len(candidates) - 1) // 2]
            guesses.append(guess)
            messages.append(_assistant(f"Is it {guess}?"))
            reply = await game.respond(instance, messages)
            if reply.done:
                assert reply.score == 1.0, f"target {target}: lost after {guesses}"
                await game.finish(instance)
                return guesses
            messages.append({"role": "user", "content": reply.content})
            keep_above = reply.content == HIGHER
            candidates = [c for c in candidates if (c > guess if keep_above else c < guess)]

    return asyncio.run(run())


@pytest.mark.parametrize(("low", "high"), [(1, 100), (-7, 9), (5, 5), (0, 1)])
def test_binary_search_always_wins_in_bound(low: int, high: int) -> None:
    bound = math.ceil(math.log2(high - low + 1)) + 1
    game = GuessingGameInteraction(max_guesses=bound)  # the game itself ends a longer search with score 0
    for target in range(low, high + 1):
        played = _candidate_player(game, target, low, high)
        transcript = binary_search_transcript(target, low, high)
        assert transcript == played
        assert transcript[-1] == target and len(transcript) <= bound
        assert len(set(transcript)) == len(transcript)
    assert not game.instances


def test_a_row_sets_its_own_guess_budget() -> None:
    game = GuessingGameInteraction(max_guesses=7)
    short = _play(game, ["1", "2", "3"], target=9, low=1, high=9, max_guesses=3)
    assert [r.done for r in short] == [False, False, True] and short[-1].score == 0.0
    longer = _play(game, ["1", "2", "3", "9"], target=9, low=1, high=9)  # the interaction's 7
    assert longer[-1].score == 1.0


def test_default_max_guesses_fits_1_to_100() -> None:
    longest = max(len(binary_search_transcript(t, 1, 100)) for t in range(1, 101))
    assert longest == GuessingGameInteraction().max_guesses == 7


def test_transcript_rejects_target_outside_range() -> None:
    with pytest.raises(ValueError, match="outside"):
        binary_search_transcript(0, 1, 10)
