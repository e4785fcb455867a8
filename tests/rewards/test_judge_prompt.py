"""The judge's rubric filling and verdict reading, on hand-written replies."""

from __future__ import annotations

import asyncio

import pytest
from fake_judge import FakeJudge

from quartet.rewards.judge_client import JudgeClient
from quartet.rewards.judge_prompt import fill_rubric, parse_verdict, question_text


@pytest.mark.parametrize(
    ("reply", "score"),
    [
        ("Good.\nScore: 7", 7.0),
        ("**Score:** 8", 8.0),
        ("score = 3.5", 3.5),
        ("Score: 7/10", 7.0),
        ("Score: 2\nOn reflection...\nScore: 9", 9.0),  # the last one wins
        ("<score>4</score> and later Score: 9", 4.0),  # a tag wins over a line
        ("<score> 6 </score>\n<score>5</score>", 5.0),
        ("Score: 0", 0.0),
        ("Score: 10.0", 10.0),
    ],
)
def test_verdicts_are_read(reply: str, score: float) -> None:
    assert parse_verdict(reply, 0.0, 10.0).score == score


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        ("", "empty reply"),
        ("   \n", "empty reply"),
        ("It is a fine answer, I would say seven.", "no verdict"),
        ("Score: 11", "outside [0, 10]"),
        ("Score: -1", "outside [0, 10]"),
        ("<score>1e400</score>", "not a finite number"),
    ],
)
def test_bad_verdicts_say_why(reply: str, problem: str) -> None:
    verdict = parse_verdict(reply, 0.0, 10.0)
    assert verdict.score is None and problem in verdict.problem


def test_placeholders_are_replaced_once_and_other_braces_kept() -> None:
    template = "{question}|{response}|{ground_truth}|{other}|{{response}}"
    assert fill_rubric(template, "Q {response}", "R {question}", None) == (
        "Q {response}|R {question}|(none given)|{other}|{R {question}}"
    )


def test_the_question_is_the_last_user_message() -> None:
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second "}, {"type": "text", "text": "part"}]},
    ]
    assert question_text(chat) == "second part"
    assert question_text("plain") == "plain" and question_text(None) == ""


def test_the_client_works_from_inside_a_running_event_loop() -> None:
    with FakeJudge() as fake:
        client = JudgeClient(fake.url, "m", timeout_s=5)

        async def from_a_loop() -> list[str | None]:
            replies, _ = client.complete_all(["GOOD3", "TAG1"])
            return [r.text for r in replies]

        texts = asyncio.run(from_a_loop())
    assert texts == ["The response is fine.\nScore: 3", "Reasoning...\n<score>1</score>"]
