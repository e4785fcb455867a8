"""A failed score call is named by its prompt's dataset row (the batch's `index` column), with the reason,
for `bad_rows.jsonl`: not only counted, nor logged by batch position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_reward_compute import FUNCTIONS, make_batch

from quartet.config.reward import RewardConfig
from quartet.rewards import InlineScorer, RewardComputer, ScorePool
from quartet.rewards.compute import ScoreFailure

RESPONSES = ["ok 1", "explode now", "ok 3", "explode again"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("rewards") / "graded.py"
    path.write_text(FUNCTIONS)
    return f"{path}:graded"


@pytest.mark.parametrize("backend", ["inline", "pool"])
def test_failures_carry_the_dataset_row_and_the_reason(tokenizer: Any, spec: str, backend: str) -> None:
    scorer: Any = InlineScorer(spec) if backend == "inline" else ScorePool(spec, num_workers=1, timeout_s=30)
    try:
        computer = RewardComputer(RewardConfig(function=spec), tokenizer, 24, backend=scorer)
        batch = make_batch(tokenizer, RESPONSES, ["1", "2", "3", "4"], ["x"] * 4, index=[40, 41, 42, 43])
        computer.score(batch)
        failures = computer.take_failures()
        assert computer.take_failures() == []  # handed over once
    finally:
        scorer.close()
    assert [(f.position, f.row, f.status) for f in failures] == [(1, 41, "error"), (3, 43, "error")]
    assert all(f.reason == "RuntimeError: exploded" for f in failures), failures
    assert all(isinstance(f, ScoreFailure) and f.data_source == "x" for f in failures)
