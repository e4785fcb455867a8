"""The built-in arithmetic task: held-out split, verifier, chat set files."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quartet.tasks.arithmetic import (
    ArithmeticProblem,
    ArithmeticSpec,
    chat_messages,
    held_out_split,
    verify_answer,
    write_sft_set,
)


def test_problems_cover_the_space_and_compute_exactly() -> None:
    spec = ArithmeticSpec(digits=1, operations=("+", "-", "*"))
    problems = {spec.problem(i) for i in range(spec.space_size)}
    assert len(problems) == spec.space_size == 300
    for p in problems:
        assert 0 <= p.a <= 9 and 0 <= p.b <= 9
        assert p.value == {"+": p.a + p.b, "-": p.a - p.b, "*": p.a * p.b}[p.op]
    assert ArithmeticProblem(3, "+", 4).question == "What is 3+4?"


def test_held_out_split_is_seeded_and_disjoint() -> None:
    spec = ArithmeticSpec(digits=1)
    train, val = held_out_split(spec, 500, 20, seed=3)
    assert len(val) == len(set(val)) == 20
    assert not set(train) & set(val) and len(train) == 500
    assert (train, val) == held_out_split(spec, 500, 20, seed=3)
    assert val != held_out_split(spec, 500, 20, seed=4)[1]
    with pytest.raises(ValueError, match="more than half"):
        held_out_split(spec, 10, 51, seed=0)


@pytest.mark.parametrize(
    ("response", "truth", "ok"),
    [
        ("7", "7", True),
        (" 7 \n", "7", True),
        ("3+4=7", "7", True),
        ("3+4 = 7.", "7", True),
        ("-3", "-3", True),
        ("07", "7", True),
        ("7 apples", "7", False),
        ("8", "7", False),
        ("", "7", False),
        ("seven", "7", False),
    ],
)
def test_verifier_is_exact(response: str, truth: str, ok: bool) -> None:
    assert verify_answer(response, truth) is ok


def test_chat_set_files(tmp_path: Path) -> None:
    spec = ArithmeticSpec(digits=1, operations=("+", "-"), worked_answer=True)
    train_path, val_path = write_sft_set(tmp_path, spec, train_size=30, val_size=10, seed=0)
    train, val = pq.read_table(train_path).to_pylist(), pq.read_table(val_path).to_pylist()
    assert (len(train), len(val)) == (30, 10)
    row = val[0]
    user, assistant = row["messages"]
    assert user["role"] == "user" and assistant["role"] == "assistant"
    assert verify_answer(assistant["content"], row["ground_truth"]) and "=" in assistant["content"]
    assert row["data_source"] == "arithmetic"
    assert chat_messages(ArithmeticProblem(2, "-", 5)) == [
        {"role": "user", "content": "What is 2-5?"},
        {"role": "assistant", "content": "-3"},
    ]
