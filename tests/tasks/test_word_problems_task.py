"""The word-problems task (python tool use): problems, programs and answers checked independently, the
held-out split, and SFT traces whose tool turn is exactly what the real python tool answers."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quartet.agents.tools.python_runner import PythonTool
from quartet.config.data import BuiltinTask
from quartet.tasks import TASKS, task_scorer
from quartet.tasks.word_problems import (
    DATA_SOURCE,
    TEMPLATES,
    WordProblemSpec,
    compute_score,
    held_out_split,
    sft_rows,
    write_rl_set,
)


def test_programs_compute_what_the_stories_ask() -> None:
    train, val = held_out_split(WordProblemSpec(digits=2), 600, 50, seed=3)
    seen_templates = set()
    for p in train + val:
        seen_templates.add(p.template)
        numbers = [int(x) for x in re.findall(r"\d+", p.question)]
        assert numbers == [p.a, p.b, p.c] or sorted(numbers) == sorted([p.a, p.b, p.c])
        expression = p.program.removeprefix("print(").removesuffix(")")
        assert re.fullmatch(r"[\d\s()+*-]+", expression)
        assert int(p.answer) == eval(expression) > 0  # noqa: S307 - digits and operators only (checked above)
        assert all(10 <= x <= 99 for x in (p.a, p.b, p.c))
    assert seen_templates == set(range(len(TEMPLATES)))


def test_the_story_numbers_drive_the_answer_as_a_reader_would_compute_it() -> None:
    """An independent reading of three templates: the pencils, the coins and the farm."""
    train, _ = held_out_split(WordProblemSpec(), 400, 10, seed=0)
    checked = 0
    for p in train:
        q = p.question
        if "pencils in each" in q:
            boxes, per, given = map(int, re.findall(r"\d+", q))
            assert int(p.answer) == boxes * per - given
        elif "coins" in q:
            had, spent, found = map(int, re.findall(r"\d+", q))
            assert int(p.answer) == had - spent + found and spent <= had
        elif "legs" in q:
            cows, hens, sold = map(int, re.findall(r"\d+", q))
            assert int(p.answer) == 4 * (cows - sold) + 2 * hens and sold <= cows
        else:
            continue
        checked += 1
    assert checked > 100


def test_validation_problems_never_occur_in_training(tmp_path: Path) -> None:
    train_path, val_path = write_rl_set(tmp_path, WordProblemSpec(), 2000, 100, seed=1)
    train, val = pq.read_table(train_path).to_pylist(), pq.read_table(val_path).to_pylist()
    questions = {r["prompt"][0]["content"] for r in train}
    assert len(val) == 100 and not any(r["prompt"][0]["content"] in questions for r in val)
    assert {r["agent_name"] for r in train} == {"tool_agent"}
    assert {r["data_source"] for r in train} == {DATA_SOURCE}


def test_the_trace_shows_exactly_what_the_python_tool_answers() -> None:
    _, val = held_out_split(WordProblemSpec(), 10, 3, seed=5)
    tool = PythonTool()
    for row, problem in zip(sft_rows(val), val, strict=True):
        user, call, tool_turn, answer = row["messages"]
        assert user["content"] == problem.question and answer["content"] == problem.answer
        arguments = json.loads(call["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert arguments == {"name": "python", "arguments": {"code": problem.program}}
        result = asyncio.run(tool.execute("trace", arguments["arguments"]))
        assert result.text == tool_turn["content"] and result.error is None
        assert (tool_turn["name"], tool_turn["tool_call_id"]) == (tool.name, "call_0_0")  # as the tool loop
        assert json.loads(row["tools"]) == [tool.schema]  # the prompt's tools block as the RL run has it


@pytest.mark.parametrize(
    ("final", "score"),
    [("1634", 1.0), (" 1634 ", 1.0), ("1635", 0.0), ("The answer is 1634", 0.0), ("", 0.0)],
)
def test_the_score_reads_the_final_turn(final: str, score: float) -> None:
    assert compute_score("whatever", "1634", {"final_message": final}) == score
    assert task_scorer(DATA_SOURCE) is compute_score
    assert TASKS[BuiltinTask.WORD_PROBLEMS].data_source == DATA_SOURCE
