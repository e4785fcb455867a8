"""Rollout tables and what `quartet inspect` reads from them, checked against independent computations:
GRPO advantages recomputed from the recorded scores, texts re-decoded from the token ids, drift recomputed
from the two log-prob lists, filters recomputed in plain Python over the whole table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from quartet.core.batch import Batch
from quartet.inspector import RunData, RunNotFoundError, SampleFilter
from quartet.trainer.records.rollout_tables import TokenTableWriter, rollout_table


def _table(run: Path, step: int) -> list[dict[str, Any]]:
    return pq.read_table(run / "rollouts" / f"step_{step}.parquet").to_pylist()


def test_a_run_writes_one_table_per_step_matching_its_jsonl(inspect_runs: tuple[Path, Path]) -> None:
    run, _ = inspect_runs
    for step in (1, 2, 3):
        rows = _table(run, step)
        jsonl = [json.loads(x) for x in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
        assert len(rows) == len(jsonl) == 16  # 4 prompts x 4 samples, every sample recorded
        for row, rec in zip(rows, jsonl, strict=True):
            assert row["step"] == step and row["tokens_dropped"] is False
            for key in ("prompt", "response", "score", "uid", "response_tokens"):
                assert (
                    row[key] == pytest.approx(rec[key])
                    if isinstance(rec[key], float)
                    else row[key] == rec[key]
                )
            assert row["advantage"] == pytest.approx(rec["advantage"], abs=1e-6)


def test_per_token_values_agree_with_independent_computations(
    inspect_runs: tuple[Path, Path], tiny_model_dir: Path
) -> None:
    run, _ = inspect_runs
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab = len(tokenizer)
    for step in (1, 2, 3):
        rows = _table(run, step)
        by_group: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_group.setdefault(row["uid"], []).append(row)
            n = row["response_tokens"]
            for key in (
                "token_ids",
                "token_text",
                "mask",
                "logprobs",
                "rollout_logprobs",
                "entropy",
                "advantages",
            ):
                assert len(row[key]) == n, key
            assert tokenizer.decode(row["token_ids"]) == row["response"]
            assert row["versions"] == [step - 1] * n  # step k samples with the weights of k - 1 updates
            assert row["token_text"] == [tokenizer.decode([t]) for t in row["token_ids"]]
            assert sum(row["mask"]) == n  # one turn: every response token is the model's
            assert all(0.0 <= e <= math.log(vocab) + 1e-4 for e in row["entropy"])
            assert all(lp <= 1e-6 for lp in row["logprobs"] + row["rollout_logprobs"])
            drift = np.mean(np.abs(np.array(row["rollout_logprobs"]) - np.array(row["logprobs"])))
            assert row["drift"] == pytest.approx(drift, abs=1e-6)
        for members in by_group.values():  # GRPO: (score - group mean) / (unbiased std + 1e-6), every token
            scores = np.array([m["score"] for m in members], dtype=np.float64)
            expected = (scores - scores.mean()) / (scores.std(ddof=1) + 1e-6)
            for m, adv in zip(members, expected, strict=True):
                assert m["advantages"] == pytest.approx([adv] * m["response_tokens"], abs=1e-4)
                assert m["advantage"] == pytest.approx(adv, abs=1e-4)


def test_run_data_lists_steps_and_opens_one_sample(inspect_runs: tuple[Path, Path]) -> None:
    run, _ = inspect_runs
    data = RunData(run)
    assert data.steps() == [{"step": s, "samples": 16, "tokens": True, "alarm": None} for s in (1, 2, 3)]
    raw = _table(run, 2)[5]
    sample = data.sample(2, 5)
    assert sample["response"] == raw["response"] and sample["score"] == pytest.approx(raw["score"])
    assert [t["token_ids"] for t in sample["tokens"]] == raw["token_ids"]
    for tok, lp, rlp in zip(sample["tokens"], raw["logprobs"], raw["rollout_logprobs"], strict=True):
        assert tok["logprobs"] == pytest.approx(lp) and tok["logprob_diff"] == pytest.approx(rlp - lp)
    fields = ["logprobs", "rollout_logprobs", "entropy", "advantages", "versions", "logprob_diff"]
    assert sample["token_fields"] == fields
    assert [t["role"] for t in sample["turns"]] == ["assistant"]
    with pytest.raises(KeyError, match="recorded steps: 1, 2, 3"):
        data.sample(9, 0)
    with pytest.raises(KeyError, match="no row 16"):
        data.sample(2, 16)


def test_a_no_signal_alarm_is_listed_without_the_mismatch_figures(tmp_path: Path) -> None:
    message = "no-signal alarm at step 5: for 5 steps all 2 groups had equal rewards (mean reward 0.000)"
    alarm = {"kind": "alarm", "step": 5, "alarm": "no_signal", "phase": "rewards", "message": message}
    lines = [{"kind": "step", "step": 5, "alarm/no_signal": 1.0}, alarm | {"alarm/no_signal_steps": 5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    expected = {"step": 5, "alarm": "no_signal", "phase": "rewards", "message": message}
    assert RunData(tmp_path).alarms() == [expected | {"value": None, "threshold": None}]


def test_alarm_records_mark_their_steps(inspect_runs: tuple[Path, Path]) -> None:
    a, b = inspect_runs
    assert RunData(a).alarms() == [] and RunData(a).steps()[0]["alarm"] is None
    written = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    tripped = {r["step"] for r in written if r["kind"] == "step" and r["alarm/mismatch"] == 1.0}
    assert tripped == {1, 2, 3}  # bf16 engine, fp32 trainer: every step
    alarms = RunData(b).alarms()
    assert [x["step"] for x in alarms] == [1, 2, 3] and {x["phase"] for x in alarms} == {"recompute"}
    assert all(f"step {x['step']}" in x["message"] and x["value"] > x["threshold"] for x in alarms)
    assert [s["alarm"] for s in RunData(b).steps()] == ["recompute"] * 3


@pytest.mark.parametrize(
    "flt",
    [
        SampleFilter(min_score=0.5),
        SampleFilter(max_score=0.0, sort="response_tokens", descending=True),
        SampleFilter(text="+"),
        SampleFilter(truncated=True),
        SampleFilter(min_drift=0.0, sort="drift"),
        SampleFilter(sort="advantage", descending=True, offset=3, limit=5),
    ],
)
def test_filters_and_sorting_equal_a_plain_python_pass(
    inspect_runs: tuple[Path, Path], flt: SampleFilter
) -> None:
    run, _ = inspect_runs
    rows = _table(run, 3)
    keep = [
        r
        for r in rows
        if (not flt.text or flt.text.lower() in (r["prompt"] + "\0" + r["response"]).lower())
        and (flt.min_score is None or r["score"] >= flt.min_score)
        and (flt.max_score is None or r["score"] <= flt.max_score)
        and (flt.truncated is None or r["truncated"] == flt.truncated)
        and (flt.min_drift is None or (r["drift"] is not None and r["drift"] >= flt.min_drift))
    ]
    keep.sort(key=lambda r: r["row"])
    keep.sort(key=lambda r: r[flt.sort], reverse=flt.descending)  # stable: ties stay in row order
    got = RunData(run).samples(3, flt)
    assert got["total"] == 16 and got["matched"] == len(keep)
    assert [r["row"] for r in got["rows"]] == [r["row"] for r in keep][flt.offset : flt.offset + flt.limit]


def test_group_and_prompt_search_across_runs(inspect_runs: tuple[Path, Path]) -> None:
    a, b = inspect_runs
    first = _table(a, 1)[0]
    group = RunData(a).group(1, first["uid"])
    assert [g["row"] for g in group] == [r["row"] for r in _table(a, 1) if r["uid"] == first["uid"]]
    assert len(group) == 4 and all(g["prompt"] == first["prompt"] for g in group)
    # run B drew the same prompts (data seed 0) and sampled them with another rollout seed
    there = RunData(b).find_prompt(first["prompt"], first["index"])
    expected = [(s, r["row"]) for s in (1, 2, 3) for r in _table(b, s) if r["index"] == first["index"]]
    assert [(t["step"], t["row"]) for t in there] == expected and len(expected) >= 4
    assert all(t["prompt"] == first["prompt"] for t in there)


def test_a_folder_that_is_not_a_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(RunNotFoundError, match="neither metrics.jsonl nor rollouts/"):
        RunData(tmp_path)
    with pytest.raises(RunNotFoundError, match="no run folder"):
        RunData(tmp_path / "missing")


class _CharTokenizer:
    """One character per token id (the test knows every decoded text in advance)."""

    def decode(self, ids: list[int], **_: Any) -> str:
        return "".join(chr(i) for i in ids)

    def batch_decode(self, rows: list[list[int]], **_: Any) -> list[str]:
        return [self.decode(r) for r in rows]


def _multi_turn_batch() -> Batch:
    text = "call|RESULT|answer"  # model 0..4, tool 5..11, model 12..17
    ids = torch.tensor([[ord(c) for c in text] + [0, 0]])
    mask = torch.tensor([[1] * 5 + [0] * 7 + [1] * 6 + [0, 0]])
    batch = Batch(
        {
            "prompts": torch.tensor([[0, ord("Q")]]),
            "responses": ids,
            "attention_mask": torch.tensor([[0, 1] + [1] * 18 + [0, 0]]),
            "response_mask": mask,
            "scores": torch.tensor([1.0]),
            "old_logprobs": -torch.arange(20, dtype=torch.float32).unsqueeze(0) / 10,
            "advantages": torch.full((1, 20), 0.5) * mask,
        }
    )
    spans = np.array([[("assistant", 0, 5), ("tool", 5, 12), ("assistant", 12, 18)], None], dtype=object)[:-1]
    agent = np.array([{"tool/calls": 1.0, "tool/failed": 1.0, "agent/assistant_turns": 2.0}], dtype=object)
    non_tensors = {
        "uid": np.array(["g0"], dtype=object),
        "turn_spans": spans,
        "agent_metrics": agent,
        "finish_reason": np.array(["stop"], dtype=object),
    }
    return batch.union(Batch({}, non_tensors, batch_size=1))


def test_multi_turn_rows_keep_who_wrote_each_token_and_the_tool_counts() -> None:
    row = rollout_table(_multi_turn_batch(), _CharTokenizer(), step=7).to_pylist()[0]
    assert row["prompt"] == "Q" and row["response"] == "call|RESULT|answer" and row["response_tokens"] == 18
    assert json.loads(row["turns"]) == [
        {"role": "assistant", "start": 0, "stop": 5},
        {"role": "tool", "start": 5, "stop": 12},
        {"role": "assistant", "start": 12, "stop": 18},
    ]
    assert row["mask"] == [1] * 5 + [0] * 7 + [1] * 6
    assert row["token_text"] == list("call|RESULT|answer")
    assert row["logprobs"] == pytest.approx([-i / 10 for i in range(18)])
    assert (row["tool_calls"], row["tool_errors"], row["num_turns"]) == (1.0, 1.0, 2.0)
    assert row["advantage"] == pytest.approx(0.5) and row["drift"] is None and row["truncated"] is False


def test_the_size_budget_drops_per_token_columns_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = TokenTableWriter(tmp_path, _CharTokenizer(), limit=0, budget_mb=1e-3)  # ~1 KB
    first = writer.write(_multi_turn_batch(), 1)
    assert "token_ids" in pq.read_schema(first).names and writer.written > 1024 * 1e-3
    second = writer.write(_multi_turn_batch(), 2)
    assert "token_ids" not in pq.read_schema(second).names
    assert pq.read_table(second).to_pylist()[0]["tokens_dropped"] is True
    assert "rollout_budget_mb" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_1.parquet", "step_2.parquet"]  # no temp files


def test_a_dataset_index_that_is_not_an_integer_is_kept_out_not_fatal() -> None:
    batch = _multi_turn_batch()
    batch.non_tensors["index"] = np.array(["row-7"], dtype=object)  # a user's own column: anything goes
    assert rollout_table(batch, _CharTokenizer(), step=1).to_pylist()[0]["index"] is None
    batch.non_tensors["index"] = np.array([np.int64(7)], dtype=object)
    assert rollout_table(batch, _CharTokenizer(), step=1).to_pylist()[0]["index"] == 7
