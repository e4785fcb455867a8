"""`quartet demo --task reasoning_gym:<name>`: the demo's three rows on a reasoning-gym task.

The same pipeline as the arithmetic demo (`quartet.demo.pipeline`: the embedded demo.yaml's tiny Qwen2 and
trainer settings), with the prompts of `data.reasoning_gym` (one task, no system prompt: the tiny
tokenizer spends ~1 token per character on English, and the model learns the answer format from the
worked examples instead):

1. **SFT start** on `sft.builtin.train_size` worked examples: the first rows of the run's RL training
   set, the question then `<answer>X</answer>` (reasoning-gym's answer format, what its `extract_answer`
   reads).
2. **GRPO** from it on the whole training set, rewarded by reasoning-gym's own verifier.
3. **More SFT** (the control) from the same start for GRPO's training time.

Accuracy: greedy answers to the GRPO run's held-out problems (none of them in training), right when
reasoning-gym's own `score_answer` gives 1.0 (`greedy_accuracy`).

`SETTINGS` holds the difficulty of the tasks the experiment (`benchmarks/reasoning_gym_tasks.py`) chose
from: short questions and answers, and more problems than training draws (held-out problems must be
fresh). Any other reasoning-gym task runs with its defaults (its prompts may be longer than
`data.max_prompt_length`: raise it with an override).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from quartet.config import QuartetConfig

__all__ = ["PREFIX", "SETTINGS", "gym_name", "gym_overrides", "with_worked_examples"]

PREFIX = "reasoning_gym:"
"""`--task reasoning_gym:<name>` names a reasoning-gym dataset."""

SETTINGS: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2},
    "count_bits": {"min_n": 1, "max_n": 4095},
    "gcd": {"min_value": 1, "max_value": 99},
    "letter_counting": {"min_words": 3, "max_words": 5},
}
"""The demo's config of each candidate task: few tokens with the tiny tokenizer, and a problem space well
beyond the training draws (held-out problems must not be training ones)."""

DEMO = [
    "data.reasoning_gym.system_prompt=none",
    "data.builtin_train_size=1000",
    "data.builtin_val_size=200",
    "data.max_prompt_length=96",
    "data.max_response_length=12",
    "sft.max_length=128",
    "sft.eval_samples=0",
    # sized for a 2-core CPU shared with other work: the questions are ~50 tokens (demo.yaml's additions
    # ~10), so a step costs ~4x; 160 SFT steps (~0.5 s each) and 16 GRPO steps (~5 s each, with as long
    # for the control) take ~4-5 minutes with the stages' start-ups and the three evaluations
    "sft.epochs=10",
    "trainer.total_steps=16",
    "trainer.test_freq=0",
]
"""Overrides of demo.yaml for every reasoning-gym task (before the task's and the user's)."""

QUICK = ["sft.epochs=2", "trainer.total_steps=3", "trainer.test_freq=0"]
"""`--quick`: a smoke of the pipeline (the margins mean nothing)."""


def gym_name(task: str) -> str | None:
    """The reasoning-gym dataset `--task` names (`reasoning_gym:<name>`), or None for another demo."""
    return task[len(PREFIX) :] if task.startswith(PREFIX) else None


def gym_overrides(name: str, quick: bool) -> list[str]:
    """The overrides that turn demo.yaml into the demo of reasoning-gym's `name` (`SETTINGS`' config, or the
    task's defaults), its own run folders (`trainer.experiment_name`), `--quick`'s sizes."""
    config = json.dumps(SETTINGS.get(name, {}))
    task = f"data.reasoning_gym.tasks=[{{name: {name}, config: {config}}}]"
    return [task, *DEMO, f"trainer.experiment_name=demo-rg-{name}", *(QUICK if quick else [])]


def with_worked_examples(cfg: QuartetConfig, folder: Path) -> QuartetConfig:
    """`cfg` with `sft.train_files` set to `folder/sft_train.parquet`: worked examples of the first
    `sft.builtin.train_size` rows of the run's RL training set (written here the way the RL run writes
    it: the same rows). Unknown task names and refused settings are ConfigErrors naming the field."""
    import pyarrow.parquet as pq

    from quartet.environments.reasoning_gym_files import sft_rows, write_config_sets, write_parquet

    train, _ = write_config_sets(cfg.data, folder / "rl")
    first = pq.read_table(train).to_pylist()[: cfg.sft.builtin.train_size]
    examples = write_parquet(sft_rows(first), folder / "sft_train.parquet")
    sft = dataclasses.replace(cfg.sft, train_files=(str(examples),), val_files=())
    return dataclasses.replace(cfg, sft=sft)
