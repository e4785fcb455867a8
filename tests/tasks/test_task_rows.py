"""Every built-in task's data sets through the shared row builder (`quartet.tasks.rows`).

The checks are properties an independent computation gives (not captured output): the columns and their
order, the counts, the answer recomputed from the prompt text, the task's own verifier accepting the
stated answer and the demonstration's final turn, held-out splits, and the same rows for the same seed.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from shape_pixels import count_kinds

from quartet.config.data import BuiltinTask
from quartet.tasks import TASKS, builtin_spec
from quartet.tasks.rows import CHAT_FILES, RL_FILES, SFT_FILES, ProblemRows, sft_row
from quartet.tasks.splits import distinct_split

RL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]
MULTI_TURN = {BuiltinTask.CALCULATOR: "tool_agent", BuiltinTask.WORD_PROBLEMS: "tool_agent"}
MULTI_TURN[BuiltinTask.GUESSING] = "user_sim"
TOOL_TASKS = (BuiltinTask.CALCULATOR, BuiltinTask.WORD_PROBLEMS)
SINGLE_TURN = (BuiltinTask.ARITHMETIC, BuiltinTask.COUNTDOWN, BuiltinTask.COUNTING, BuiltinTask.SHAPES)
IMAGE_TASKS = (BuiltinTask.SHAPES,)
SFT_NAMES = {task: CHAT_FILES for task in SINGLE_TURN}


def _read(paths: tuple[Path, Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    train, val = (pq.read_table(p) for p in paths)
    return train.to_pylist(), val.to_pylist()


def _columns(path: Path) -> list[str]:
    return [str(name) for name in pq.read_table(path).column_names]


def _recomputed_answer(task: BuiltinTask, row: dict[str, Any]) -> str | None:
    """The answer worked out from the row's own text, apart from the task's code; None where the prompt
    does not hold it (countdown, guessing)."""
    question = row["prompt"][0]["content"]
    if task is BuiltinTask.SHAPES:  # counted from the picture's pixels (tests/tasks/shape_pixels.py)
        return str(count_kinds(row["images"][0]["bytes"])[row["extra_info"]["target"]])
    if task is BuiltinTask.ARITHMETIC:
        a, op, b = re.fullmatch(r"What is (\d+)([+*-])(\d+)\?", question).groups()  # type: ignore[union-attr]
        return str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
    if task is BuiltinTask.CALCULATOR:
        a, b, c = re.fullmatch(r"What is (\d+) \* (\d+) \+ (\d+)\?", question).groups()  # type: ignore[union-attr]
        return str(int(a) * int(b) + int(c))
    if task is BuiltinTask.COUNTING:
        start, end = re.fullmatch(r"Count from (\d+) to (\d+), separated by spaces\.", question).groups()  # type: ignore[union-attr]
        return f"{int(start)}..{int(end)}"
    if task is BuiltinTask.WORD_PROBLEMS:
        program = re.fullmatch(r"print\(([\d()+*\- ]+)\)", row["extra_info"]["program"])
        assert program is not None and question.endswith("?")
        return str(eval(program.group(1), {"__builtins__": {}}))  # digits, + - * and parentheses only
    return None


def _problem(row: dict[str, Any]) -> str:
    """What makes a row's problem, apart from its place in the set."""
    extra = {k: v for k, v in row["extra_info"].items() if k not in ("split", "index")}
    pictures = [hashlib.sha256(image["bytes"]).hexdigest() for image in row.get("images") or []]
    return json.dumps([row["prompt"], extra, pictures])


def _stated_answer(task: BuiltinTask, row: dict[str, Any]) -> str:
    """A response that states the row's answer in the task's answer format."""
    if task is BuiltinTask.COUNTDOWN:
        return str(row["extra_info"]["solution"])
    if task is BuiltinTask.COUNTING:  # the ground truth names the run (start..end); the answer writes it out
        info = row["extra_info"]
        return " ".join(str(n) for n in range(info["start"], info["end"] + 1))
    return str(row["reward_model"]["ground_truth"])


@pytest.mark.parametrize("task", list(BuiltinTask))
def test_rl_set_rows(task: BuiltinTask, tmp_path: Path) -> None:
    entry = TASKS[task]
    paths = entry.write_rl_set(tmp_path, entry.default_spec, 40, 16, 5)
    assert [p.name for p in paths] == list(RL_FILES)
    train, val = _read(paths)
    extra_columns = ["agent_name"] if task in MULTI_TURN else ["images"] if task in IMAGE_TASKS else []
    assert _columns(paths[0]) == RL_COLUMNS + extra_columns
    assert len(train) == 40 and len(val) >= 16
    for split, rows in (("train", train), ("val", val)):
        assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
        for row in rows:
            assert row["extra_info"]["split"] == split and row["data_source"] == entry.data_source
            assert row["reward_model"]["style"] == "rule" and [m["role"] for m in row["prompt"]] == ["user"]
            assert row.get("agent_name") == MULTI_TURN.get(task)
            truth = row["reward_model"]["ground_truth"]
            assert entry.verify_answer(_stated_answer(task, row), truth)
            assert _recomputed_answer(task, row) in (None, truth)
    if task is not BuiltinTask.GUESSING:  # its prompt is the same opening for every target
        assert not {_problem(r) for r in val} & {_problem(r) for r in train}


def _final_score(task: BuiltinTask, row: dict[str, Any]) -> float:
    final = row["messages"][-1]["content"]
    return TASKS[task].compute_score(final, row["ground_truth"], {"final_message": final})


@pytest.mark.parametrize("task", list(BuiltinTask))
def test_sft_set_rows(task: BuiltinTask, tmp_path: Path) -> None:
    entry = TASKS[task]
    paths = entry.write_sft_set(tmp_path, entry.default_spec, 30, 12, 2)
    assert [p.name for p in paths] == list(SFT_NAMES.get(task, SFT_FILES))
    train, val = _read(paths)
    assert (len(train), len(val)) == (30, 12)
    tools = ["tools"] if task in TOOL_TASKS else []
    images = ["images"] if task in IMAGE_TASKS else []
    assert _columns(paths[0]) == ["messages", *tools, *images, "ground_truth", "data_source"]
    for row in train + val:
        assert row["data_source"] == entry.data_source and row["messages"][0]["role"] == "user"
        assert row["messages"][-1]["role"] == "assistant"
        assert _final_score(task, row) == 1.0  # the default demonstrator is always right
        if tools:
            assert [t["function"]["name"] for t in json.loads(row["tools"])] in (["calculator"], ["python"])


@pytest.mark.parametrize("task", list(BuiltinTask))
def test_same_seed_same_rows(task: BuiltinTask, tmp_path: Path) -> None:
    entry = TASKS[task]
    spec = builtin_spec(task, 2, sloppy=0.5) or entry.default_spec
    first = (
        entry.write_rl_set(tmp_path / "a", spec, 24, 8, 11),
        entry.write_sft_set(tmp_path / "a", spec, 24, 8, 11),
    )
    again = (
        entry.write_rl_set(tmp_path / "b", spec, 24, 8, 11),
        entry.write_sft_set(tmp_path / "b", spec, 24, 8, 11),
    )
    other = entry.write_rl_set(tmp_path / "c", spec, 24, 8, 12)
    for made, remade in zip(first, again, strict=True):
        assert _read(made) == _read(remade)
    assert _read(other)[0] != _read(first[0])[0]


@pytest.mark.parametrize("task", TOOL_TASKS)
def test_sloppy_share_draws_from_its_own_stream(task: BuiltinTask, tmp_path: Path) -> None:
    """The weak demonstrations sit where `Random(seed + 2)` says and leave the problems drawn as they are."""
    entry = TASKS[task]
    sharp, _ = _read(entry.write_sft_set(tmp_path / "sharp", builtin_spec(task, 2, sloppy=0.0), 40, 8, 4))
    loose, _ = _read(entry.write_sft_set(tmp_path / "loose", builtin_spec(task, 2, sloppy=0.5), 40, 8, 4))
    rng = random.Random(4 + 2)
    weak = [rng.random() < 0.5 for _ in loose]
    assert [r["messages"][0] for r in sharp] == [r["messages"][0] for r in loose]
    assert [len(r["messages"]) == 2 for r in loose] == weak
    assert all(len(r["messages"]) == 4 for r in sharp)


def test_problem_rows_and_distinct_split() -> None:
    rows: ProblemRows[int] = ProblemRows(
        "squares", "math", str, lambda n: str(n * n), lambda n: {"n": n}, "a"
    )
    (row,) = rows.rl_rows([3], "val")
    assert list(row) == [*RL_COLUMNS, "agent_name"] and row["reward_model"]["ground_truth"] == "9"
    assert row["extra_info"] == {"split": "val", "index": 0, "n": 3} and row["agent_name"] == "a"
    (sft,) = rows.sft_rows([4], lambda n, weak: [{"role": "user", "content": str(n)}])
    assert sft == sft_row([{"role": "user", "content": "4"}], "16", "squares")
    assert list(sft) == ["messages", "ground_truth", "data_source"]
    train, val = distinct_split(lambda rng: rng.randrange(20), lambda n: n % 10, 50, 6, 0)
    assert len({n % 10 for n in val}) == 6 and not {n % 10 for n in train} & {n % 10 for n in val}
