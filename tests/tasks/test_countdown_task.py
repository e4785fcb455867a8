"""The countdown task: safe exact verifier, solvable generated problems, held-out split, data sets."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quartet.tasks.countdown import (
    DATA_SOURCE,
    CountdownProblem,
    CountdownSpec,
    ExpressionError,
    compute_score,
    evaluate_expression,
    extract_expression,
    generate_problem,
    held_out_split,
    write_rl_set,
    write_sft_set,
)

TRUTH = json.dumps({"target": 24, "numbers": [3, 8, 2, 2]})


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("3*8*(2/2)", 1.0),
        ("8*3*2/2", 1.0),
        ("Let me think.\n3*8=24\n<answer> (2/2)*8*3 </answer>", 1.0),
        ("steps...\n8*3*2/2 = 24", 1.0),  # the last line, from before its `=`
        ("3*8*(2/2).", 1.0),
        ("(3-2/2)*8+8", 0.0),  # 8 used twice
        ("3*8", 0.0),  # 2 and 2 unused: TinyZero's rule is exactly once
        ("3*8*2/2*1", 0.0),  # a number that is not given
        ("3*8+2-2", 1.0),
        ("3*8+2+2", 0.0),  # uses each once but is 28
        ("", 0.0),
        ("the answer is twenty-four", 0.0),
        ("(3*8*2/2", 0.0),  # unbalanced
        ("3*8*(2/(2-2))", 0.0),  # a 2 too many, and division by zero
    ],
)
def test_compute_score(response: str, score: float) -> None:
    assert compute_score(response, TRUTH) == score


@pytest.mark.parametrize(
    "attack",
    [
        "__import__('os').system('echo hacked')",
        "().__class__.__bases__[0].__subclasses__()",
        "abs(3)*8*2/2",
        "x*8*2/2",
        "3**8*2/2",
        "9**9**9**9",  # a huge exponent: must be rejected before anything is computed
        "3.0*8*2/2",
        "-3*-8*2/2",
        "0x3*8*2/2",
        "3*8*2/2 if 1 else 0",
        "[3,8,2,2]",
        "(" * 300 + "3" + ")" * 300,
    ],
)
def test_unsafe_or_foreign_syntax_scores_zero(attack: str) -> None:
    assert compute_score(attack, TRUTH) == 0.0
    with pytest.raises(ExpressionError):
        evaluate_expression(attack)


def test_division_is_exact() -> None:
    assert evaluate_expression("(7/2)*4") == (Fraction(14), [7, 2, 4])
    assert compute_score("(7/2)*4", {"target": 14, "numbers": [4, 2, 7]}) == 1.0
    assert compute_score("7/3*3", json.dumps({"target": 7, "numbers": [7, 3, 3]})) == 1.0
    with pytest.raises(ValueError, match="countdown ground truth"):
        compute_score("1", "not json")


def test_generated_problems_are_solvable_by_their_kept_solution() -> None:
    spec = CountdownSpec(min_numbers=3, max_numbers=4, max_value=20, max_target=100)
    rng = random.Random(0)
    counts = set()
    for _ in range(300):
        p = generate_problem(spec, rng)
        counts.add(len(p.numbers))
        assert all(1 <= n <= 20 for n in p.numbers) and 1 <= p.target <= 100
        value, literals = evaluate_expression(p.solution)
        assert value == p.target and sorted(literals) == sorted(p.numbers)
        assert compute_score(p.solution, p.ground_truth) == 1.0
        assert compute_score("\n".join([*p.steps, p.solution]), p.ground_truth) == 1.0
        # each step is a true equation on positive integers, the last one giving the target
        for step in p.steps:
            lhs, rhs = step.split("=")
            assert evaluate_expression(lhs)[0] == int(rhs) > 0
        assert int(p.steps[-1].split("=")[1]) == p.target
    assert counts == {3, 4}


def test_held_out_split_is_seeded_and_disjoint() -> None:
    spec = CountdownSpec()
    train, val = held_out_split(spec, 400, 50, seed=1)
    assert len(train) == 400 and len({p.key for p in val}) == len(val) == 50
    assert not {p.key for p in train} & {p.key for p in val}
    assert (train, val) == held_out_split(spec, 400, 50, seed=1)
    assert val != held_out_split(spec, 400, 50, seed=2)[1]
    tiny = CountdownSpec(min_numbers=2, max_numbers=2, min_value=1, max_value=2, operations=("+",))
    with pytest.raises(ValueError, match="distinct validation problems"):
        held_out_split(tiny, 10, 5, seed=0)


def _key(row: dict) -> tuple[tuple[int, ...], int]:
    truth = json.loads(row["reward_model"]["ground_truth"])
    return CountdownProblem(tuple(truth["numbers"]), truth["target"], "").key


def test_rl_and_sft_sets(tmp_path: Path) -> None:
    spec = CountdownSpec(answer_tags=True)
    train_path, val_path = write_rl_set(tmp_path / "rl", spec, train_size=30, val_size=10, seed=0)
    train, val = pq.read_table(train_path).to_pylist(), pq.read_table(val_path).to_pylist()
    assert (len(train), len(val)) == (30, 10)
    row = val[3]
    assert row["data_source"] == DATA_SOURCE and row["reward_model"]["style"] == "rule"
    assert row["extra_info"]["split"] == "val" and row["extra_info"]["index"] == 3
    truth = json.loads(row["reward_model"]["ground_truth"])
    (message,) = row["prompt"]
    assert message["role"] == "user" and str(truth["target"]) in message["content"]
    assert "<answer></answer>" in message["content"]
    assert compute_score(
        f"<answer>{row['extra_info']['solution']}</answer>", row["reward_model"]["ground_truth"]
    )
    assert not {_key(r) for r in train} & {_key(r) for r in val}

    sft_train, _ = write_sft_set(tmp_path / "sft", spec, train_size=5, val_size=3, seed=0)
    for r in pq.read_table(sft_train).to_pylist():
        user, assistant = r["messages"]
        assert user["role"] == "user" and assistant["role"] == "assistant"
        assert assistant["content"].endswith("</answer>") and "=" in assistant["content"]
        assert compute_score(assistant["content"], r["ground_truth"]) == 1.0


def test_extract_expression() -> None:
    assert extract_expression("<answer>1+2</answer> then <answer> 3*4 </answer>") == "3*4"
    assert extract_expression("3+5=8\n8*7=56\n(3+5)*7\n\n") == "(3+5)*7"
    assert extract_expression("(3+5)*7 = 56.") == "(3+5)*7"
    assert extract_expression("   ") == ""
