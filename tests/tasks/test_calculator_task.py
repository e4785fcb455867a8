"""The calculator task: held-out split, traces whose tool turns are the true results, the exact scorer, and
SFT with the tools column (tools block rendered, only assistant turns trained)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from quartet.config.data import BuiltinTask
from quartet.sft.data import SFTDataError, load_sft_files, tokenize_chat
from quartet.tasks import TASKS, task_scorer
from quartet.tasks.calculator import (
    CALCULATOR_TOOLS,
    CalculatorSpec,
    compute_score,
    held_out_split,
    tool_call_text,
    write_rl_set,
    write_sft_set,
)


def test_split_is_seeded_and_held_out() -> None:
    train, val = held_out_split(CalculatorSpec(3), 500, 50, seed=4)
    assert (train, val) == held_out_split(CalculatorSpec(3), 500, 50, seed=4)
    assert len(set(val)) == 50 and not set(train) & set(val)
    assert all(100 <= p.a <= 999 and 100 <= p.b <= 999 and 0 <= p.c <= 999 for p in train + val)
    assert TASKS[BuiltinTask.CALCULATOR].compute_score is compute_score is task_scorer("calculator")


def test_rl_and_sft_rows(tmp_path: Path) -> None:
    train_rl, val_rl = write_rl_set(tmp_path / "rl", CalculatorSpec(3), 40, 10, seed=1)
    rows = pq.read_table(train_rl).to_pylist()
    assert all(r["agent_name"] == "tool_agent" and r["data_source"] == "calculator" for r in rows)
    for r in rows:
        a, b, c = (int(x) for x in r["extra_info"]["expression"].replace("*", "+").split("+"))
        assert r["reward_model"]["ground_truth"] == str(a * b + c)  # independent arithmetic
    val_questions = {r["prompt"][0]["content"] for r in pq.read_table(val_rl).to_pylist()}
    assert not val_questions & {r["prompt"][0]["content"] for r in rows}

    train_sft, _ = write_sft_set(tmp_path / "sft", CalculatorSpec(3), 40, 10, seed=1)
    for r in pq.read_table(train_sft).to_pylist():
        user, call, tool, answer = r["messages"]
        expression = user["content"].removeprefix("What is ").removesuffix("?")
        parsed = json.loads(call["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))
        assert parsed == {"name": "calculator", "arguments": {"expression": expression}}
        a, b, c = (int(x) for x in expression.replace("*", "+").split("+"))
        assert tool["role"] == "tool" and tool["content"] == answer["content"] == str(a * b + c)
        assert (tool["name"], tool["tool_call_id"]) == ("calculator", "call_0_0")  # as the tool loop
        assert json.loads(r["tools"]) == CALCULATOR_TOOLS


@pytest.mark.parametrize(
    ("final", "score"),
    [
        ("442027", 1.0),
        (" 442027\n", 1.0),
        ("442028", 0.0),
        ("The answer is 442027", 0.0),
        (tool_call_text("1+1"), 0.0),
    ],
)
def test_score_reads_the_final_turn(final: str, score: float) -> None:
    assert compute_score("whatever came before", "442027", {"final_message": final}) == score
    assert compute_score(f"earlier turns\n{final}", "442027") == score


def test_sft_with_tools_renders_the_block_and_masks_assistant_turns(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    path, _ = write_sft_set(tmp_path, CalculatorSpec(3), 3, 2, seed=0)
    examples, report = load_sft_files([path], tok, max_length=1024)
    assert report.kept == 3
    row = pq.read_table(path).to_pylist()[0]
    messages = [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]  # parquet fills keys
    ex = tokenize_chat(tok, messages, tools=CALCULATOR_TOOLS)
    assert dataclasses.replace(ex, ground_truth=examples[0].ground_truth) == examples[0]
    prompt_text = tok.decode(list(ex.prompt_ids))
    assert "You can call these tools" in prompt_text and "calculator(expression)\n<|im_end|>" in prompt_text
    # independently: the trained tokens are exactly the two assistant turns, each through its <|im_end|>
    ids = list(ex.response_ids)
    trained = tok.decode([t for t, m in zip(ids, ex.response_mask, strict=True) if m])
    call, answer = row["messages"][1]["content"], row["messages"][3]["content"]
    assert trained == f"{call}<|im_end|>{answer}<|im_end|>"
    assert tok.convert_tokens_to_ids("<tool_call>") in ids  # one special token, as the parser expects

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": row["messages"], "tools": "{not json"}) + "\n")
    with pytest.raises(SFTDataError, match=r"bad.jsonl.*row 0.*tools.*not valid JSON"):
        load_sft_files([bad], tok)
