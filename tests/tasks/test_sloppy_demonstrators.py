"""Mixed-quality SFT traces (`sft.builtin.sloppy`): a share answers from the head, without the tool."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quartet.config import load_config
from quartet.config.errors import ConfigError
from quartet.tasks.calculator import CalculatorSpec, held_out_split, write_sft_set
from quartet.tasks.word_problems import TEMPLATES, WordProblemSpec
from quartet.tasks.word_problems import held_out_split as word_split
from quartet.tasks.word_problems import write_sft_set as write_word_sft


def _tens(x: int) -> int:
    """Round half up to tens, written differently from the code under test."""
    return int(round(x / 10 + 1e-9)) * 10 if x % 10 != 5 else x + 5


def _rows(path: Path) -> list[list[dict[str, str]]]:
    return [
        json.loads(m) if isinstance(m, str) else list(m) for m in pq.read_table(path)["messages"].to_pylist()
    ]


@pytest.mark.parametrize("sloppy", [0.0, 0.5, 1.0])
def test_calculator_share_and_head_answers(tmp_path: Path, sloppy: float) -> None:
    spec = CalculatorSpec(digits=2, sloppy=sloppy)
    train_path, val_path = write_sft_set(tmp_path, spec, 400, 20, seed=3)
    train, _ = held_out_split(spec, 400, 20, seed=3)
    rows = _rows(train_path)
    head = [(p, m) for p, m in zip(train, rows, strict=True) if len(m) == 2]
    tool = [(p, m) for p, m in zip(train, rows, strict=True) if len(m) == 4]
    assert len(head) + len(tool) == 400
    if sloppy == 0.0:
        assert not head
    elif sloppy == 1.0:
        assert not tool
    else:  # Binomial(400, 0.5): 200 +- 10 (SD); 5 SDs either side
        assert 150 <= len(head) <= 250
    for problem, messages in head:
        assert messages[0]["content"] == problem.question
        assert "<tool_call>" not in messages[1]["content"]
        assert int(messages[1]["content"]) == _tens(problem.a) * _tens(problem.b) + problem.c
    wrong = sum(int(m[1]["content"]) != problem.a * problem.b + problem.c for problem, m in head)
    assert wrong >= 0.9 * len(head)
    for problem, messages in tool:
        assert messages[-1]["content"] == str(problem.a * problem.b + problem.c)
    assert all(len(m) == 4 for m in _rows(val_path))  # validation traces stay clean


def test_word_problems_head_answers(tmp_path: Path) -> None:
    spec = WordProblemSpec(digits=2, sloppy=0.5)
    train_path, _ = write_word_sft(tmp_path, spec, 200, 20, seed=1)
    train, _ = word_split(spec, 200, 20, seed=1)
    head = [(p, m) for p, m in zip(train, _rows(train_path), strict=True) if len(m) == 2]
    assert 60 <= len(head) <= 140
    for p, messages in head:
        expression = TEMPLATES[p.template].program(_tens(p.a), _tens(p.b), _tens(p.c))
        assert int(messages[1]["content"]) == eval(expression)  # a template's arithmetic, from the test


def test_sloppy_is_refused_where_it_has_no_meaning() -> None:
    with pytest.raises(ConfigError, match="sloppy"):
        load_config(None, ["sft.builtin.task=arithmetic", "sft.builtin.sloppy=0.5"])
    with pytest.raises(ValueError, match="sloppy"):
        CalculatorSpec(sloppy=1.5)
