"""PromptDataset: verl-layout rows rendered with the chat template, checked, counted and batched."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from quartet.config.data import DataConfig, OverlongPrompt
from quartet.data.errors import DataError
from quartet.data.prompts import PromptDataset

QUESTIONS = ["What is 3+4?", "hello", "Please solve the sum of 12 and 30 and check the final answer.", "hi"]


def _row(i: int, question: str, **changes: Any) -> dict[str, Any]:
    row = {
        "data_source": "arithmetic",
        "prompt": [{"role": "system", "content": "think"}, {"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"split": "train", "index": i},
    }
    row.update(changes)
    return row


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _render(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """The independent reference: one apply_chat_template call per row."""
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    )


def _cfg(**changes: Any) -> DataConfig:
    return DataConfig(**{"max_prompt_length": 256, **changes})


def test_batch_is_left_padded_and_equals_per_row_templates(tmp_path: Path, chat_tokenizer: Any) -> None:
    path = _parquet(tmp_path / "train.parquet", [_row(i, q) for i, q in enumerate(QUESTIONS)])
    ds = PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert len(ds) == 4 and ds.report.loaded == 4 and ds.report.rows == 4
    assert ds.report.seconds > 0 and ds.source(2).file == str(path) and ds.source(2).row == 2

    batch = ds.batch([2, 0, 3])
    expected = [_render(chat_tokenizer, _row(i, QUESTIONS[i])["prompt"]) for i in (2, 0, 3)]
    width = max(len(e) for e in expected)
    prompts, mask = batch["prompts"], batch["attention_mask"]
    assert prompts.dtype == mask.dtype == torch.int64 and prompts.shape == mask.shape == (3, width)
    pad = chat_tokenizer.pad_token_id
    for b, ids in enumerate(expected):
        n_pad = width - len(ids)
        assert prompts[b, n_pad:].tolist() == ids
        assert prompts[b, :n_pad].tolist() == [pad] * n_pad
        assert mask[b].tolist() == [0] * n_pad + [1] * len(ids)
    assert list(batch["index"]) == [2, 0, 3]
    assert list(batch["ground_truth"]) == ["2", "0", "3"]
    assert list(batch["data_source"]) == ["arithmetic"] * 3
    assert batch["extra_info"][1] == {"split": "train", "index": 0}
    assert batch["raw_prompt"][0] == _row(2, QUESTIONS[2])["prompt"]
    assert "agent_name" not in batch
    assert ds.prompt_ids(2) == expected[0]


def test_jsonl_rows_agent_name_and_non_string_ground_truths(tmp_path: Path, chat_tokenizer: Any) -> None:
    path = tmp_path / "rows.jsonl"
    rows = [
        _row(0, "hi", agent_name="tool_agent", extra_info={"tools_kwargs": {"search": {"k": 1}}}),
        _row(1, "hello", reward_model={"ground_truth": 42}),
        _row(2, "hello", reward_model={"ground_truth": {"target": 5, "numbers": [2, 3]}}, extra_info=None),
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    batch = ds.batch([0, 1, 2])
    assert list(batch["agent_name"]) == ["tool_agent", None, None]
    assert list(batch["ground_truth"]) == ["0", "42", '{"target": 5, "numbers": [2, 3]}']
    assert batch["extra_info"][0] == {"tools_kwargs": {"search": {"k": 1}}} and batch["extra_info"][2] == {}
    assert ds.source(1).line == 2


def test_from_rows_and_dotted_ground_truth_key(chat_tokenizer: Any) -> None:
    messages = np.array([{"role": "user", "content": "hi"}], dtype=object)  # as pandas hands rows over
    rows = [{"q": messages, "src": "mine", "label": {"answer": {"value": "7"}}}]
    cfg = _cfg(prompt_key="q", data_source_key="src", ground_truth_key="label.answer.value")
    batch = PromptDataset.from_rows(rows, cfg, chat_tokenizer, "memory").batch([0])
    assert list(batch["ground_truth"]) == ["7"] and list(batch["data_source"]) == ["mine"]
    assert batch["raw_prompt"][0] == [{"role": "user", "content": "hi"}]
    with pytest.raises(DataError, match=r"memory, row 1, column 'q'"):
        PromptDataset.from_rows([*rows, {**rows[0], "q": "hi"}], cfg, chat_tokenizer, "memory")


def test_malformed_parquet_row_names_file_row_and_column(tmp_path: Path, chat_tokenizer: Any) -> None:
    rows = [_row(i, "hi") for i in range(4)]
    rows[2]["prompt"] = [{"role": None, "content": "hi"}]
    path = _parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DataError) as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    message = str(err.value)
    assert str(path) in message and "row 2" in message and "column 'prompt[0].role'" in message
    assert "data.skip_bad_rows=true" in message
    assert (err.value.file, err.value.row, err.value.column) == (str(path), 2, "prompt[0].role")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("What is 3+4?", "expected a list of {role, content} messages, got str"),
        ([], "the prompt has no messages"),
        (["hi"], "expected a {role, content} message, got str"),
        ([{"role": "user", "content": 3}], "expected a string, got int"),
    ],
)
def test_wrong_prompt_types(tmp_path: Path, chat_tokenizer: Any, value: Any, expected: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row(0, "hi")) + "\n" + json.dumps(_row(1, "hi", prompt=value)) + "\n")
    with pytest.raises(DataError, match=r"row 1 \(line 2\)") as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert expected in str(err.value)


def test_missing_column_suggests_the_config_key(tmp_path: Path, chat_tokenizer: Any) -> None:
    rows = [{"prompts" if k == "prompt" else k: v for k, v in _row(0, "hi").items()}]
    path = _parquet(tmp_path / "a.parquet", rows)
    with pytest.raises(DataError, match="column 'prompt': no such column") as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert "set data.prompt_key=prompts" in str(err.value)

    path = _parquet(tmp_path / "b.parquet", [_row(0, "hi", reward_model={"answer": "3", "style": "rule"})])
    with pytest.raises(DataError, match="no 'ground_truth' inside 'reward_model'") as err:
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)
    assert "set data.ground_truth_key=reward_model.answer" in str(err.value)

    path = _parquet(tmp_path / "c.parquet", [_row(0, "hi", reward_model={"ground_truth": None})])
    with pytest.raises(DataError, match="the ground truth is empty"):
        PromptDataset.from_files([str(path)], _cfg(), chat_tokenizer)


def test_overlong_prompts_filtered_truncated_or_fatal(tmp_path: Path, chat_tokenizer: Any) -> None:
    rows = [_row(i, q) for i, q in enumerate(QUESTIONS)]
    path = _parquet(tmp_path / "a.parquet", rows)
    lengths = [len(_render(chat_tokenizer, r["prompt"])) for r in rows]
    limit = sorted(lengths)[1]  # two rows fit (ties aside), the others do not
    too_long = sum(n > limit for n in lengths)
    assert too_long >= 1

    filtered = PromptDataset.from_files([str(path)], _cfg(max_prompt_length=limit), chat_tokenizer)
    assert filtered.report.filtered_overlong == too_long and len(filtered) == 4 - too_long
    assert filtered.report.truncated == 0 and filtered.report.longest_prompt <= limit

    cfg = _cfg(max_prompt_length=limit, overlong_prompt=OverlongPrompt.TRUNCATE)
    truncated = PromptDataset.from_files([str(path)], cfg, chat_tokenizer)
    assert truncated.report.truncated == too_long and len(truncated) == 4
    for i, r in enumerate(rows):
        assert truncated.prompt_ids(i) == _render(chat_tokenizer, r["prompt"])[-limit:]
    assert truncated.batch(range(4))["prompts"].shape == (4, limit)

    cfg = _cfg(max_prompt_length=limit, overlong_prompt=OverlongPrompt.ERROR, skip_bad_rows=True)
    with pytest.raises(DataError, match=f"longer than data.max_prompt_length={limit}") as err:
        PromptDataset.from_files([str(path)], cfg, chat_tokenizer)
    assert err.value.row == lengths.index(next(n for n in lengths if n > limit))

    with pytest.raises(DataError, match="no usable rows"):
        PromptDataset.from_files([str(path)], _cfg(max_prompt_length=min(lengths) - 1), chat_tokenizer)


def test_skip_bad_rows_counts_by_reason_and_logs_once(
    tmp_path: Path, chat_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mixed.jsonl"
    lines = [
        json.dumps(_row(0, "hi")),
        "{broken",
        json.dumps(_row(2, "hi", prompt=[])),
        json.dumps(_row(3, "hi", reward_model={"ground_truth": ""})),
        json.dumps(_row(4, "hello", reward_model={"ground_truth": None})),
        json.dumps({k: v for k, v in _row(5, "hi").items() if k != "data_source"}),
        json.dumps(_row(6, "hello")),
    ]
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="quartet.data.prompts"):
        ds = PromptDataset.from_files([str(path)], _cfg(skip_bad_rows=True), chat_tokenizer)
    assert len(ds) == 2 and list(ds.batch([0, 1])["ground_truth"]) == ["0", "6"]
    assert list(ds.batch([1])["index"]) == [1] and ds.source(1).row == 6
    assert ds.report.bad_rows == {
        "invalid_json": 1,
        "empty_prompt": 1,
        "missing_ground_truth": 2,
        "missing_column": 1,
    }
    assert ds.report.skipped == 5 and ds.report.rows == 7 and ds.report.loaded == 2
    assert "row 3 (line 4)" in ds.report.first_bad["missing_ground_truth"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "skipped 5 malformed rows" in warnings[0].getMessage()
    assert "line 2" in warnings[0].getMessage()


def test_builtin_rl_sets_fit_the_default_prompt_length(tmp_path: Path, chat_tokenizer: Any) -> None:
    from quartet.config.data import BuiltinTask
    from quartet.tasks import write_builtin

    # shapes' prompts hold a picture, which a text model refuses: tests/benchmarks/test_bench_vision.py
    # measures them with the tiny VLM
    for task in (t for t in BuiltinTask if t is not BuiltinTask.SHAPES):
        train, val = write_builtin(task, tmp_path, train_size=64, val_size=16, seed=0)
        # word problems (stories) and the guessing game (the rules) open with longer text: their examples set
        # 320 (with the tools block) and 96 tokens
        long = task in (BuiltinTask.WORD_PROBLEMS, BuiltinTask.GUESSING)
        cfg = DataConfig(max_prompt_length=128) if long else DataConfig()
        ds = PromptDataset.from_files([str(train), str(val)], cfg, chat_tokenizer)
        rows = 64 + (32 if task is BuiltinTask.GUESSING else 16)  # the game validates on all 32 numbers
        assert len(ds) == rows and ds.report.filtered_overlong == 0, ds.report.summary()
        assert set(ds.batch(range(4))["data_source"]) == {task.value}
