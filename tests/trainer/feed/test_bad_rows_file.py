"""The run folder's `bad_rows.jsonl`: every row skipped or cut at load, named; a restart rewrites them."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.data.prompts import PromptDataset
from quartet.trainer.feed.rl_data import RLData, source_checker
from quartet.trainer.feed.run_files import name_bad_rows
from quartet.trainer.loop.rl_trainer import RLTrainer


def _row(source: str) -> dict[str, Any]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": "What is 1+1?"}],
        "reward_model": {"ground_truth": "2"},
    }


def test_rows_skipped_at_load_are_written_to_the_run_folder(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from transformers import AutoTokenizer

    cfg = load_config(None, [f"trainer.output_dir={tmp_path}", "data.skip_bad_rows=true"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    rows = [_row("arithmetic"), _row("nope"), _row("arithmetic"), _row("gsm9k")]
    train = PromptDataset.from_rows(rows, cfg.data, tokenizer, "memory", check_source=source_checker(cfg))
    assert len(train) == 2
    trainer = RLTrainer(cfg)
    trainer.run_dir.mkdir(parents=True)
    with caplog.at_level(logging.WARNING, logger="quartet.trainer.feed.run_files"):
        path = name_bad_rows(trainer.run_dir, RLData(train, None))
        name_bad_rows(
            trainer.run_dir, RLData(train, None)
        )  # a restart loads the same rows: not written twice
    assert path == str(trainer.run_dir / "bad_rows.jsonl")
    named = [json.loads(line) for line in Path(path).read_text().splitlines()]
    assert [(n["stage"], n["row"], n["field"], n["reason"]) for n in named] == [
        ("load", 1, "data_source", "unknown_data_source"),
        ("load", 3, "data_source", "unknown_data_source"),
    ]
    assert "no rule scorer for data_source 'nope'" in named[0]["message"]
    message = caplog.records[-1].getMessage()
    assert "2 rows skipped, dropped or cut at load" in message and path in message
