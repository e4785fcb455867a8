"""Rows of the built-in tasks' data sets and of converted data, and the writing of a task's two splits.

An RL row, verl's layout (what `PromptDataset` reads):
    {"data_source": str, "prompt": [{"role": "user", "content": ...}], "ability": str,
     "reward_model": {"style": "rule", "ground_truth": str}, "extra_info": {"split": str, "index": int, ...}}
(tool and user-simulation tasks add `agent_name` last). An SFT row: `messages`, `tools` (JSON text of the
tool schemas, tool tasks only), `ground_truth`, `data_source`, in that column order.

`ProblemRows` is the one place that turns a task's problems into both kinds of rows, so the tasks differ
only in what is theirs (question, answer, extra fields, the demonstration), not in how a row is laid out.
This module sits in `quartet.tasks` (not `quartet.data`) because the tasks write these rows and
`quartet.tasks` must not import `quartet.data`; `quartet.data.convert` imports it from here.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = [
    "CHAT_FILES",
    "RL_FILES",
    "SFT_FILES",
    "ProblemRows",
    "rl_row",
    "sft_row",
    "write_parquet",
    "write_splits",
]

RL_FILES = ("rl_train.parquet", "rl_val.parquet")
"""(train, validation) file names of a task's RL prompt set."""
SFT_FILES = ("sft_train.parquet", "sft_val.parquet")
"""(train, validation) file names of a multi-turn task's SFT traces (next to its RL set)."""
CHAT_FILES = ("train.parquet", "val.parquet")
"""(train, validation) file names of a single-turn task's chat set (a folder of its own)."""

ProblemT = TypeVar("ProblemT")
Messages = list[dict[str, str]]


def rl_row(
    messages: list[dict[str, str]],
    data_source: str,
    ground_truth: str,
    *,
    index: int,
    split: str,
    ability: str = "",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One row of the layout; `extra` is merged into `extra_info` after `split` and `index`."""
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **(extra or {})},
    }


def sft_row(
    messages: Messages, ground_truth: str, data_source: str, tools: str | None = None
) -> dict[str, Any]:
    """One row of an SFT set; the `tools` column only where the task renders tool schemas."""
    row: dict[str, Any] = {"messages": messages}
    if tools is not None:
        row["tools"] = tools
    row["ground_truth"] = ground_truth
    row["data_source"] = data_source
    return row


@dataclass(frozen=True)
class ProblemRows(Generic[ProblemT]):
    """How one task's problems become rows: everything but the problems and the demonstrations."""

    data_source: str
    ability: str
    question: Callable[[ProblemT], str]
    """The opening user message."""
    answer: Callable[[ProblemT], str]
    """The ground truth as the task's verifier reads it."""
    extra: Callable[[ProblemT], Mapping[str, Any]]
    """Fields added to `extra_info` after `split` and `index`."""
    agent_name: str | None = None
    """The agent loop of a multi-turn task (`tool_agent`, `user_sim`); None for single-turn tasks."""

    def rl_rows(self, problems: Iterable[ProblemT], split: str) -> list[dict[str, Any]]:
        """The RL prompt set's rows of `problems`, indexed from 0 within the split."""
        rows = []
        for i, problem in enumerate(problems):
            row = rl_row(
                [{"role": "user", "content": self.question(problem)}],
                self.data_source,
                self.answer(problem),
                index=i,
                split=split,
                ability=self.ability,
                extra=self.extra(problem),
            )
            if self.agent_name is not None:
                row["agent_name"] = self.agent_name
            rows.append(row)
        return rows

    def sft_rows(
        self,
        problems: Iterable[ProblemT],
        messages: Callable[[ProblemT, bool], Messages],
        *,
        sloppy: float = 0.0,
        seed: int = 0,
        tools: str | None = None,
    ) -> list[dict[str, Any]]:
        """The SFT set's rows: `messages(problem, weak)` is the demonstration, `weak` true for a share
        `sloppy` of the rows, drawn in order from `Random(seed + 2)` (a stream of its own, apart from
        the problems' draws)."""
        rng = random.Random(seed + 2)
        return [
            sft_row(messages(p, rng.random() < sloppy), self.answer(p), self.data_source, tools)
            for p in problems
        ]


def write_parquet(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write `rows` (dicts with the same columns) as one parquet file; its path. Parent folders are made."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([dict(r) for r in rows]), path)
    return path


def write_splits(
    folder: str | Path,
    names: tuple[str, str],
    train_rows: list[dict[str, Any]],
    val_rows: list[dict[str, Any]],
) -> tuple[Path, Path]:
    """Write the train and validation rows as `folder/names[0]` and `folder/names[1]`; their paths."""
    folder = Path(folder)
    return write_parquet(train_rows, folder / names[0]), write_parquet(val_rows, folder / names[1])
