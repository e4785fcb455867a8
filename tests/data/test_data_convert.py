"""GSM8K / MATH JSON Lines -> verl parquet, answers extracted exactly, bad lines named or skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from quartet.config.data import DataConfig
from quartet.data.convert import (
    GSM8K_INSTRUCTION,
    MATH_DATA_SOURCE,
    SourceKind,
    convert_jsonl,
    gsm8k_final_answer,
    last_boxed,
    main,
)
from quartet.data.errors import DataError
from quartet.data.prompts import PromptDataset

GSM8K = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A farm sells 1,200 eggs a day. Per week?", "answer": "1200*7=8400\n#### 8,400"},
    {"question": "Debt?", "answer": "He owes 5.\n#### -5"},
]
MATH = [
    {"problem": "Half of one?", "solution": "We get $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"},
    {"problem": "2+2?", "solution": "First \\boxed{3}, no: \\boxed{4}."},
    {"problem": "Set?", "solution": "So $\\boxed{\\{1, 2\\}}$ and \\fbox{x^{2}}"},
    {"problem": "One?", "solution": "The answer is $\\boxed 1$."},
]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_gsm8k(tmp_path: Path) -> None:
    out = tmp_path / "gsm8k.parquet"
    report = convert_jsonl(SourceKind.GSM8K, _jsonl(tmp_path / "in.jsonl", GSM8K), out, split="test")
    assert (report.rows, report.written, report.skipped) == (3, 3, 0)
    rows = pq.read_table(out).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "8400", "-5"]
    assert {r["data_source"] for r in rows} == {"openai/gsm8k"}
    (message,) = rows[1]["prompt"]
    assert message == {"role": "user", "content": f"{GSM8K[1]['question']} {GSM8K_INSTRUCTION}"}
    assert rows[1]["extra_info"] == {
        "split": "test",
        "index": 1,
        "question": GSM8K[1]["question"],
        "answer": GSM8K[1]["answer"],
    }


def test_math_takes_the_last_boxed_answer(tmp_path: Path) -> None:
    out = tmp_path / "math.parquet"
    convert_jsonl(SourceKind.MATH, _jsonl(tmp_path / "in.jsonl", MATH), out)
    rows = pq.read_table(out).to_pylist()
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{1}{2}", "4", "x^{2}", "1"]
    assert {r["data_source"] for r in rows} == {MATH_DATA_SOURCE}
    content = rows[0]["prompt"][0]["content"]
    assert content.startswith("Half of one? ") and "\\boxed{}" in content


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{a{b}c}", "a{b}c"),
        ("\\boxed{1} and \\boxed{2}", "2"),
        ("\\boxed{unclosed {", None),
        ("no box", None),
        ("\\boxed{}", ""),
        ("\\fbox{7} then \\boxed{8}", "8"),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_gsm8k_final_answer() -> None:
    assert gsm8k_final_answer("x\n#### 1,234,567") == "1234567"
    assert gsm8k_final_answer("#### 3 #### 4.5") == "4.5"
    with pytest.raises(ValueError, match="no '####'"):
        gsm8k_final_answer("42")
    with pytest.raises(ValueError, match="not a number"):
        gsm8k_final_answer("#### forty-two")


def test_bad_lines_are_named_or_skipped(tmp_path: Path) -> None:
    records: list[Any] = [GSM8K[0], "{not json", {"question": "q"}, {"question": "q", "answer": "no marker"}]
    source = _jsonl(tmp_path / "in.jsonl", [*records, GSM8K[1]])
    with pytest.raises(DataError, match=r"row 1 \(line 2\)") as err:
        convert_jsonl(SourceKind.GSM8K, source, tmp_path / "out.parquet")
    assert "--skip-bad-lines" in str(err.value)
    report = convert_jsonl(SourceKind.GSM8K, source, tmp_path / "out.parquet", skip_bad_lines=True)
    assert (report.rows, report.written, report.skipped) == (5, 2, 3)
    assert "line 3" in report.problems[1] and "'answer'" in report.problems[1]
    assert "'####'" in report.problems[2]
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [r["extra_info"]["index"] for r in rows] == [0, 1]  # indices of the written rows


def test_cli_and_loading_the_output(tmp_path: Path, chat_tokenizer: Any) -> None:
    source = _jsonl(tmp_path / "in.jsonl", MATH)
    out = tmp_path / "out" / "math.parquet"
    assert main(["math", str(source), str(out), "--data-source", "my/math"]) == 0
    assert main(["gsm8k", str(source), str(tmp_path / "x.parquet")]) == 2  # MATH lines lack `question`
    ds = PromptDataset.from_files([str(out)], DataConfig(max_prompt_length=512), chat_tokenizer)
    assert len(ds) == 4 and set(ds.batch([0, 1])["data_source"]) == {"my/math"}
    gsm8k = _jsonl(tmp_path / "g.jsonl", GSM8K)
    command = [sys.executable, "-m", "quartet.data.convert", "gsm8k", str(gsm8k), str(tmp_path / "g.parquet")]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "3 rows, 3 written, 0 skipped" in done.stderr
