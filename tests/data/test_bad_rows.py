"""Rows that cannot be used, found at load and named: a data_source no rule scores, text that is not UTF-8
(parquet and JSONL), over-long prompts, prompts with an empty message, only system messages or an unknown
role (tool turns and OpenAI's roles stay valid); each skipped row is listed in `DatasetReport.bad`, and the
trainer writes them to `<run dir>/bad_rows.jsonl`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quartet.config import load_config
from quartet.config.data import DataConfig
from quartet.data.bad_rows import BadRow, replace_load_rows
from quartet.data.errors import DataError
from quartet.data.prompts import PromptDataset
from quartet.tracking.run_layout import BAD_ROWS_FILE
from quartet.trainer.feed.rl_data import source_checker


def _row(i: int, source: str = "arithmetic", question: str = "What is 3+4?") -> dict[str, Any]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "reward_model": {"style": "rule", "ground_truth": str(i)},
    }


def _cfg(**changes: Any) -> DataConfig:
    return DataConfig(**{"max_prompt_length": 256, **changes})


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _checker() -> Any:
    check = source_checker(load_config(None, []))
    assert check is not None  # the default config scores with the built-in rules
    return check


def test_unknown_data_source_is_refused_at_load_naming_file_row_and_fix(
    tmp_path: Path, chat_tokenizer: Any
) -> None:
    path = _jsonl(tmp_path / "train.jsonl", [_row(0), _row(1), _row(2, source="gsm9k"), _row(3)])
    with pytest.raises(DataError) as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer, check_source=_checker())
    message = str(err.value)
    assert (err.value.file, err.value.row, err.value.line) == (str(path), 2, 3)
    assert "column 'data_source'" in message and "no rule scorer for data_source 'gsm9k'" in message
    assert "known data sources:" in message and "'openai/gsm8k'" in message and "'arithmetic'" in message
    assert "reward.function=" in message and "data.skip_bad_rows=true" in message


def test_unknown_data_source_is_skipped_counted_and_named_with_skip_bad_rows(
    tmp_path: Path, chat_tokenizer: Any
) -> None:
    path = _jsonl(tmp_path / "train.jsonl", [_row(0), _row(1, source="gsm9k"), _row(2)])
    ds = PromptDataset.from_files(
        [str(path)], _cfg(skip_bad_rows=True), chat_tokenizer, check_source=_checker()
    )
    assert len(ds) == 2 and list(ds.batch([0, 1])["data_source"]) == ["arithmetic", "arithmetic"]
    assert ds.report.bad_rows == {"unknown_data_source": 1}
    (bad,) = ds.report.bad
    assert (bad.file, bad.row, bad.line, bad.field, bad.reason) == (
        str(path),
        1,
        2,
        "data_source",
        "unknown_data_source",
    )


def test_no_source_check_with_a_custom_function_or_a_reward_model() -> None:
    assert source_checker(load_config(None, ["reward.function=my_scores.py:score"])) is None
    assert source_checker(load_config(None, ["reward.model_path=/some/rm"])) is None


def _bad_utf8_parquet(path: Path) -> Path:
    """Three rows; row 1's question holds the byte 0xff (pyarrow writes it; it fails when read as text)."""
    questions = [b"What is 3+4?", b"What is \xff?", b"What is 1+1?"]
    raw = pa.array(questions, pa.binary())
    text = pa.Array.from_buffers(pa.string(), len(questions), raw.buffers())  # no UTF-8 check on purpose
    table = pa.table(
        {
            "data_source": ["arithmetic"] * 3,
            "question": text,
            "prompt": [[{"role": "user", "content": "hi"}]] * 3,
            "reward_model": [{"style": "rule", "ground_truth": str(i)} for i in range(3)],
        }
    )
    pq.write_table(table, path)
    return path


def test_invalid_utf8_in_parquet_is_named_or_skipped(tmp_path: Path, chat_tokenizer: Any) -> None:
    path = _bad_utf8_parquet(tmp_path / "train.parquet")
    with pytest.raises(DataError) as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert (err.value.file, err.value.row, err.value.column) == (str(path), 1, "question")
    assert "not valid UTF-8 (byte 0xff" in str(err.value)

    ds = PromptDataset.from_files([str(path)], _cfg(skip_bad_rows=True), chat_tokenizer)
    assert len(ds) == 2 and list(ds.batch([0, 1])["ground_truth"]) == ["0", "2"]
    assert ds.report.bad_rows == {"invalid_utf8": 1}
    assert [(b.row, b.field, b.reason) for b in ds.report.bad] == [(1, "question", "invalid_utf8")]


def test_invalid_utf8_in_jsonl_is_named_or_skipped(tmp_path: Path, chat_tokenizer: Any) -> None:
    path = tmp_path / "train.jsonl"
    lines = [json.dumps(_row(i)).encode() for i in range(3)]
    lines[1] = lines[1].replace(b"What is 3+4?", b"What is \xff?")
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(DataError) as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert (err.value.file, err.value.row, err.value.line) == (str(path), 1, 2)
    assert err.value.column == "prompt[0].content" and "byte 0xff" in str(err.value)

    ds = PromptDataset.from_files([str(path)], _cfg(skip_bad_rows=True), chat_tokenizer)
    assert len(ds) == 2 and ds.report.bad_rows == {"invalid_utf8": 1}
    assert [(b.row, b.line, b.field) for b in ds.report.bad] == [(1, 2, "prompt[0].content")]


def test_every_bad_and_overlong_row_is_named_and_written(tmp_path: Path, chat_tokenizer: Any) -> None:
    rows = [_row(0), _row(1, source="x"), _row(2, question="word " * 200), _row(3, source="y"), _row(4)]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    cfg = _cfg(skip_bad_rows=True, max_prompt_length=64)
    ds = PromptDataset.from_files([str(path)], cfg, chat_tokenizer, check_source=_checker())
    assert len(ds) == 2
    named = sorted((b.row, b.reason) for b in ds.report.bad)
    assert named == [(1, "unknown_data_source"), (2, "overlong_filtered"), (3, "unknown_data_source")]

    out = tmp_path / "run" / BAD_ROWS_FILE
    earlier = BadRow("reward", str(path), 4, "reward", "error", "raised", step=3)
    out.parent.mkdir()
    out.write_text(json.dumps(earlier.as_dict()) + "\n" + '{"stage": "load", "row": 99}\n{"torn')
    replace_load_rows(out, ds.report.bad)  # a restart: its load lines replace the old ones
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["row"] for line in lines if line["stage"] == "load") == [1, 2, 3]
    assert [line["step"] for line in lines if line["stage"] == "reward"] == [3]
    assert all(line["file"] == str(path) for line in lines)


def test_invalid_utf8_in_a_json_array_file_spoils_only_its_row(tmp_path: Path, chat_tokenizer: Any) -> None:
    path = tmp_path / "train.json"
    text = json.dumps([_row(0), _row(1, question="What is 1?"), _row(2)]).encode()
    path.write_bytes(text.replace(b"What is 1?", b"What is \xfe?"))
    ds = PromptDataset.from_files([str(path)], _cfg(skip_bad_rows=True), chat_tokenizer)
    assert len(ds) == 2 and list(ds.batch([0, 1])["ground_truth"]) == ["0", "2"]
    assert [(b.row, b.field, b.reason) for b in ds.report.bad] == [(1, "prompt[0].content", "invalid_utf8")]
    assert "byte 0xfe" in ds.report.bad[0].message


def _chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {**_row(0), "prompt": list(messages)}


SYSTEM = {"role": "system", "content": "Answer briefly."}
USER = {"role": "user", "content": "What is 3+4?"}
BAD_MESSAGES = [
    (_chat(SYSTEM, {"role": "user", "content": ""}), "prompt[1].content", "empty_message"),
    (_chat({"role": "user", "content": " \n\t"}), "prompt[0].content", "empty_message"),
    (_chat(SYSTEM), "prompt", "system_only_prompt"),
    (_chat({"role": "robot", "content": "beep"}, USER), "prompt[0].role", "unknown_role"),
]


def test_empty_system_only_and_unknown_role_messages_are_bad_rows(
    tmp_path: Path, chat_tokenizer: Any
) -> None:
    rows = [_row(0)] + [row for row, _, _ in BAD_MESSAGES] + [_row(5)]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert (err.value.file, err.value.row, err.value.column) == (str(path), 1, "prompt[1].content")
    assert "the user message has no text ('')" in str(err.value) and "data.skip_bad_rows=true" in str(
        err.value
    )

    ds = PromptDataset.from_files([str(path)], _cfg(skip_bad_rows=True), chat_tokenizer)
    assert len(ds) == 2 and list(ds.batch([0, 1])["ground_truth"]) == ["0", "5"]
    assert ds.report.bad_rows == {"empty_message": 2, "system_only_prompt": 1, "unknown_role": 1}
    named = [(b.row, b.field, b.reason) for b in ds.report.bad]
    assert named == [(i + 1, field, reason) for i, (_, field, reason) in enumerate(BAD_MESSAGES)]
    robot = ds.report.bad[-1].message
    assert "unknown role 'robot'" in robot
    out = tmp_path / "run" / BAD_ROWS_FILE
    out.parent.mkdir()
    replace_load_rows(out, ds.report.bad)  # what the trainer writes to <run dir>/bad_rows.jsonl
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(w["row"], w["field"], w["reason"]) for w in written] == named


def test_tool_turns_and_the_openai_roles_stay_valid(tmp_path: Path, chat_tokenizer: Any) -> None:
    call = {"type": "function", "function": {"name": "calc", "arguments": {"expression": "3+4"}}}
    rows = [
        _chat(
            SYSTEM,
            USER,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "7"},
        ),
        _chat(
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": ""},
        ),
        _chat({"role": "developer", "content": "Be brief."}, USER),
    ]
    path = _jsonl(tmp_path / "train.jsonl", rows)
    ds = PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert len(ds) == 3 and ds.report.bad == []
