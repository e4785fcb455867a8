"""SFT data: the assistant-only mask, malformed rows, parquet and JSONL, length limits, collation."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from quartet.sft.data import SFTDataError, SFTExample, collate, load_sft_files, tokenize_chat

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 3+4?"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "And weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"c": "P"}}}],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "thanks"},
]


def _mask_from_offsets(tokenizer: Any, messages: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Independent reference: tokenize the rendered TEXT with character offsets, and mark every token lying
    inside an assistant turn's body (after `<|im_start|>assistant\\n`, through its `<|im_end|>`)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = [m.span(1) for m in re.finditer(r"<\|im_start\|>assistant\n(.*?<\|im_end\|>)", text, re.DOTALL)]
    mask = [int(any(a <= s and e <= b for a, b in spans)) for s, e in enc["offset_mapping"]]
    return enc["input_ids"], mask


def test_assistant_mask_is_exactly_the_assistant_tokens(tokenizer: Any) -> None:
    ex = tokenize_chat(tokenizer, CHAT)
    ids, ref_mask = _mask_from_offsets(tokenizer, CHAT[:-1])  # a trailing user turn trains nothing
    assert list(ex.prompt_ids + ex.response_ids) == ids
    assert [0] * len(ex.prompt_ids) + list(ex.response_mask) == ref_mask
    # The prompt ends with the first assistant header; the masked spans decode to the assistant turns.
    assert tokenizer.decode(ex.prompt_ids).endswith("What is 3+4?<|im_end|>\n<|im_start|>assistant\n")
    runs, current = [], []
    for tok, m in zip(ex.response_ids, ex.response_mask, strict=True):
        if m:
            current.append(tok)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    assert runs[0] == "7<|im_end|>"
    assert runs[1].startswith("<tool_call>") and "get_weather" in runs[1] and runs[1].endswith("<|im_end|>")
    assert runs[2] == "It is sunny.<|im_end|>"
    assert len(runs) == 3
    unmasked = tokenizer.decode([t for t, m in zip(ex.response_ids, ex.response_mask, strict=True) if not m])
    assert "sunny<|im_end|>" in unmasked and "And weather in Paris?" in unmasked
    assert "It is sunny." not in unmasked


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


GOOD = {"messages": [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "2"}]}
BAD_ROWS = [  # (row, field named in the error)
    ({"msgs": GOOD["messages"]}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "1+1?"}]}, "messages"),  # no assistant turn
    (
        {"messages": [{"role": "user", "content": 5}, {"role": "assistant", "content": "2"}]},
        "messages[0].content",
    ),
    ({"messages": [{"content": "x"}, {"role": "assistant", "content": "2"}]}, "messages[0].role"),
    ({"messages": ["hi", {"role": "assistant", "content": "2"}]}, "messages[0]"),
    ('{"messages": [', ""),  # not JSON
]


@pytest.mark.parametrize(("bad", "field"), BAD_ROWS)
def test_malformed_row_error_names_file_row_and_field(
    tokenizer: Any, tmp_path: Path, bad: Any, field: str
) -> None:
    path = _write_jsonl(tmp_path / "train.jsonl", [GOOD, GOOD, bad, GOOD])
    with pytest.raises(SFTDataError) as info:
        load_sft_files([path], tokenizer)
    err = info.value
    assert (err.file, err.row, err.line, err.field) == (str(path), 2, 3, field)
    assert str(path) in str(err) and "row 2" in str(err) and f"field '{field}'" in str(err)


def test_malformed_rows_are_counted_when_skipping(tokenizer: Any, tmp_path: Path) -> None:
    rows = [GOOD, *(bad for bad, _ in BAD_ROWS), GOOD]
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    examples, report = load_sft_files([path], tokenizer, skip_bad_rows=True)
    assert len(examples) == 2
    assert (report.rows, report.kept, report.malformed) == (len(rows), 2, len(BAD_ROWS))
    assert len(report.problems) == len(BAD_ROWS) and all(str(path) in p for p in report.problems)


def test_broken_prefix_property_is_reported(tokenizer: Any, tmp_path: Path) -> None:
    """A template that drops earlier assistant turns (as some reasoning templates do) cannot be masked."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{%- for m in messages -%}"
        "{%- if m['role'] == 'assistant' and not loop.last -%}{{- '<|im_start|>assistant\\n<|im_end|>\\n' -}}"
        "{%- else -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' -}}{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    two_turns = {
        "messages": [
            *GOOD["messages"],
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
        ]
    }
    path = _write_jsonl(tmp_path / "chat.jsonl", [two_turns])
    with pytest.raises(SFTDataError, match="prefix property") as info:
        load_sft_files([path], tok)
    assert info.value.field == "messages[1]"


def test_parquet_and_jsonl_load_the_same_examples(tokenizer: Any, tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"What is {a}+2?"},
                {"role": "assistant", "content": str(a + 2)},
            ]
        }
        for a in range(5)
    ]
    jsonl = _write_jsonl(tmp_path / "rows.jsonl", rows)
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    from_jsonl, _ = load_sft_files([jsonl], tokenizer)
    from_parquet, report = load_sft_files([parquet], tokenizer)
    assert from_jsonl == from_parquet and report.kept == 5
    with pytest.raises(ValueError, match="unknown format"):
        load_sft_files([_write_jsonl(tmp_path / "rows.csv", [])], tokenizer)


def test_overlong_rows_are_filtered_or_truncated_and_counted(tokenizer: Any, tmp_path: Path) -> None:
    long_answer = {"messages": [GOOD["messages"][0], {"role": "assistant", "content": "2 " * 40}]}
    path = _write_jsonl(tmp_path / "train.jsonl", [GOOD, long_answer])
    short = tokenize_chat(tokenizer, GOOD["messages"])
    limit = short.length + 4
    kept, report = load_sft_files([path], tokenizer, max_length=limit)
    assert len(kept) == 1 and (report.overlong_filtered, report.truncated) == (1, 0)
    kept, report = load_sft_files([path], tokenizer, max_length=limit, truncate=True)
    assert len(kept) == 2 and (report.overlong_filtered, report.truncated) == (0, 1)
    assert kept[1].length == limit and all(kept[1].response_mask)
    # A prompt that alone fills the limit leaves nothing to train: filtered even with truncation.
    _, report = load_sft_files([path], tokenizer, max_length=len(short.prompt_ids), truncate=True)
    assert report.overlong_filtered == 2


def test_collate_pads_prompts_left_responses_right_and_fills_to_a_multiple() -> None:
    a = SFTExample((1, 2, 3), (4, 5), (1, 1))
    b = SFTExample((6,), (7, 8, 9), (1, 0, 1))
    batch = collate([a, b], pad_id=0, multiple_of=4)
    assert len(batch) == 4
    assert batch["prompts"][:2].tolist() == [[1, 2, 3], [0, 0, 6]]
    assert batch["responses"][:2].tolist() == [[4, 5, 0], [7, 8, 9]]
    assert batch["attention_mask"][:2].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert batch["response_mask"].tolist() == [[1, 1, 0], [1, 0, 1], [0, 0, 0], [0, 0, 0]]
    assert torch.equal(batch["prompts"][2], batch["prompts"][0])  # fillers: row 0, nothing trained


def test_keep_verified_drops_the_answers_the_verifier_rejects(tokenizer: Any, tmp_path: Path) -> None:
    """Rejection-sampled demonstrations: of a calculator set from two demonstrators, only the rows whose
    final answer equals a*b+c (computed here from the question) are kept, and the rest are counted."""
    from quartet.tasks.calculator import CalculatorSpec, write_sft_set

    train, _ = write_sft_set(tmp_path, CalculatorSpec(2, sloppy=0.5), 40, 4, seed=3)
    rows = pq.read_table(train).to_pylist()
    right = 0
    for row in rows:
        a, b, c = map(int, re.findall(r"\d+", row["messages"][0]["content"]))
        right += row["messages"][-1]["content"] == str(a * b + c)
    assert 0 < right < len(rows)  # both demonstrators are present
    examples, report = load_sft_files([train], tokenizer, max_length=1024, keep_verified=True)
    assert (report.rows, report.kept, report.unverified_filtered) == (len(rows), right, len(rows) - right)
    assert "failed the verifier" in report.summary()
    assert all(len(ex.messages) == 4 for ex in examples)  # only the tool traces remain


def test_keep_verified_names_a_row_it_cannot_check(tokenizer: Any, tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "train.jsonl", [GOOD])
    with pytest.raises(SFTDataError, match=r"row 0 \(line 1\), field 'data_source'.*keep_verified"):
        load_sft_files([path], tokenizer, keep_verified=True)
    odd = {**GOOD, "data_source": "my_task", "ground_truth": "7"}
    path = _write_jsonl(tmp_path / "odd.jsonl", [odd])
    with pytest.raises(SFTDataError, match="no built-in verifier for data_source 'my_task'"):
        load_sft_files([path], tokenizer, keep_verified=True)
