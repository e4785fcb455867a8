"""Rollout records: what a run writes with `trainer.rollout_freq`, checked against the verifier and the
tokenizer; multi-turn rows split into model and environment turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from quartet.config import load_config
from quartet.core.batch import Batch
from quartet.rewards.rules.registry import select_scorer
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.records.rollout_records import rollout_rows


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.usefixtures("one_local_rank")
def test_a_run_writes_train_and_validation_records(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(
        None,
        [
            "cluster.backend=local",
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.builtin_train_size=16",
            "data.builtin_val_size=6",
            "data.train_batch_size=4",
            "data.max_response_length=8",
            "rollout.n=2",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=2",
            "actor.mixed_precision=float32",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.rollout_freq=2",
            "trainer.rollout_samples=3",
            "trainer.export_final=false",
        ],
    )
    result = RLTrainer(cfg).run()
    folder = result.run_dir / "rollouts"
    assert sorted(p.name for p in folder.iterdir()) == [
        "step_2.jsonl",
        "step_2.parquet",  # the same rows with per-token values (trainer.rollout_tokens, quartet inspect)
        "val_step_0.jsonl",
        "val_step_2.jsonl",
    ]
    train = _lines(folder / "step_2.jsonl")
    assert len(train) == 3 and all(r["step"] == 2 for r in train)
    assert len(_lines(folder / "val_step_0.jsonl")) == 6  # every validation prompt, greedy n=1
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    scorer = select_scorer("arithmetic")
    for rec in train + _lines(folder / "val_step_2.jsonl"):
        assert rec["data_source"] == "arithmetic"
        assert rec["prompt_tokens"] == len(tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"])
        assert 1 <= rec["response_tokens"] <= 8
        clean = tokenizer.decode(
            tokenizer(rec["response"], add_special_tokens=False)["input_ids"], skip_special_tokens=True
        )
        assert rec["score"] == scorer("arithmetic", clean, rec["ground_truth"])  # what the verifier says
        assert "turns" not in rec
    assert all("advantage" in r and "reward" in r for r in train)
    scores = {
        r["step"]: r["critic/score/mean"]
        for r in _lines(result.run_dir / "metrics.jsonl")
        if r["kind"] == "step"
    }
    assert set(scores) == {1, 2}


class _Chars:
    """A tokenizer whose token i is the character chr(97 + i)."""

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(97 + i) for i in ids)


def test_multi_turn_rows_get_turns() -> None:
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])  # model, tool output, model, then padding
    batch = Batch(
        {
            "prompts": torch.tensor([[3, 4]]),
            "responses": torch.tensor([[0, 1, 2, 2, 5, 9]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0]]),
            "response_mask": mask,
            "advantages": torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.5, 0.0]]),
        },
        batch_size=1,
    )
    (rec,) = rollout_rows(batch, _Chars(), step=7)
    assert rec["prompt"] == "de" and rec["response"] == "abccf" and rec["response_tokens"] == 5
    assert rec["turns"] == [
        {"role": "assistant", "text": "ab", "tokens": 2, "mask": 1, "advantage": 0.5},
        {"role": "environment", "text": "cc", "tokens": 2, "mask": 0},
        {"role": "assistant", "text": "f", "tokens": 1, "mask": 1, "advantage": 0.5},
    ]
    assert rec["advantage"] == 0.5


def test_turns_follow_the_agent_loops_spans_with_their_rewards_and_advantages() -> None:
    """A model turn, a tool result, a model turn, a user reply, a model turn cut by the response width."""
    mask = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1]])
    spans = np.empty(1, dtype=object)
    spans[0] = [("assistant", 0, 2), ("tool", 2, 3), ("assistant", 3, 4), ("user", 4, 6), ("assistant", 6, 9)]
    batch = Batch(
        {
            "prompts": torch.tensor([[3]]),
            "responses": torch.tensor([[0, 1, 2, 3, 4, 4, 5, 6]]),
            "attention_mask": torch.ones(1, 9, dtype=torch.int64),
            "response_mask": mask,
            "turn_rewards": torch.tensor([[0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]),
            "advantages": torch.tensor([[0.75, 0.75, 0.0, -0.5, 0.0, 0.0, 0.1, 0.1]]),
        },
        {"turn_spans": spans},
        batch_size=1,
    )
    (rec,) = rollout_rows(batch, _Chars(), step=1)
    assert [(t["role"], t["text"], t["mask"]) for t in rec["turns"]] == [
        ("assistant", "ab", 1),
        ("tool", "c", 0),
        ("assistant", "d", 1),
        ("user", "ee", 0),
        ("assistant", "fg", 1),  # the span ran past the response: cut to it
    ]
    model = [t for t in rec["turns"] if t["mask"]]
    assert [t["turn_reward"] for t in model] == [0.25, 0.0, 0.0]
    assert [t["advantage"] for t in model] == pytest.approx([0.75, -0.5, 0.1])
    assert all("turn_reward" not in t and "advantage" not in t for t in rec["turns"] if not t["mask"])
