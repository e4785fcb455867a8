"""reasoning-gym mixtures written as a run's prompt files: the `data.reasoning_gym` section and the tool.

`write_config_sets(data, folder)` turns the config section into `folder/reasoning_gym/rl_train.parquet`
and `rl_val.parquet` (verl's layout; `quartet train` calls it when `data.train_files` is empty and
`data.reasoning_gym.tasks` is not). `write_rl_sets` is the shared writer (also
`tools/reasoning_gym_data.py`'s): training rows from the tasks' seeds, validation rows from seeds
`VAL_SEED_OFFSET` away (reasoning-gym seeds entry i of seed s with s + i, so nearby seeds share problems),
leaving out every validation problem whose question is also in training. The same arguments write the
same rows: a resumed run reads what the first run read.

`sft_rows` makes worked examples of the same problems (the question, then `<answer>X</answer>`: the
answer format reasoning-gym's default system prompt asks for and its `extract_answer` reads), the demo's
SFT start.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quartet.config.data import DataConfig
from quartet.config.errors import ConfigError
from quartet.config.reasoning_gym import ReasoningGymConfig
from quartet.environments.reasoning_gym import GymTask, rows, task_names

__all__ = [
    "FOLDER",
    "RL_FILES",
    "VAL_SEED_OFFSET",
    "config_tasks",
    "resolve_system_prompt",
    "sft_rows",
    "write_config_sets",
    "write_parquet",
    "write_rl_sets",
]

FOLDER = "reasoning_gym"
"""The subfolder of the run's data folder that holds the files `write_config_sets` writes."""

VAL_SEED_OFFSET = 10_000_019
"""Validation datasets' seeds: far from training's (reasoning-gym seeds entry i of seed s with s + i)."""

RL_FILES = ("rl_train.parquet", "rl_val.parquet")
"""(train, validation) file names, as the built-in tasks' (`quartet.tasks.rows.RL_FILES`: same layer, not
importable from here)."""

FIELD = "data.reasoning_gym"


def write_parquet(table_rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """`table_rows` as one parquet file at `path` (its folder made); the path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(list(table_rows)), path)
    return path


def resolve_system_prompt(text: str) -> str | None:
    """The system message `data.reasoning_gym.system_prompt` names: a reasoning-gym style's text (`default`
    and the other `SYSTEM_PROMPTS` keys), None for `none`, any other text as written."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if text.strip().lower() == "none":
        return None
    return str(SYSTEM_PROMPTS[text]) if text in SYSTEM_PROMPTS else text


def config_tasks(section: ReasoningGymConfig, seed: int, size: int) -> list[GymTask]:
    """The section's tasks as `GymTask`s (a task's own seed, or `seed`; its own size, or `size`).

    Each task is built once here, so an unknown name (ConfigError naming `tasks[i].name` and the close
    names) or settings its dataset refuses (ConfigError naming `tasks[i].config` and reasoning-gym's
    reason) stop the run before any worker starts.
    """
    names = task_names()
    out = []
    for i, task in enumerate(section.tasks):
        where = f"{FIELD}.tasks[{i}]"
        if task.name not in names:
            close = difflib.get_close_matches(task.name, names, n=5, cutoff=0.5)
            close += [n for n in names if task.name in n and n not in close][:5]
            hint = f"close names: {', '.join(close)}; " if close else ""
            raise ConfigError(
                f"{where}.name",
                f"reasoning-gym has no task {task.name!r}",
                f"{hint}reasoning_gym.factory.DATASETS lists all {len(names)}",
            )
        gym = GymTask(
            task.name,
            dict(task.config or {}),
            seed=seed if task.seed is None else task.seed,
            size=task.size or size,
            weight=task.weight,
        )
        try:
            rows([gym], 1, system_prompt=None)
        except Exception as err:  # reasoning-gym's own config checks: asserts, TypeErrors, ValueErrors
            raise ConfigError(
                f"{where}.config",
                f"reasoning-gym refuses {task.name}'s settings {json.dumps(task.config)}: "
                f"{type(err).__name__}: {err}",
                f"use the keywords of reasoning_gym.factory.DATASETS[{task.name!r}]'s config class",
            ) from None
        out.append(gym)
    return out


def _with_system(row: dict[str, Any], system: str | None) -> dict[str, Any]:
    if system:
        row["prompt"] = [{"role": "system", "content": system}, *row["prompt"]]
    return row


def _question(row: dict[str, Any]) -> str:
    return str(row["prompt"][-1]["content"])


def write_rl_sets(
    folder: str | Path,
    tasks: Sequence[GymTask],
    train_size: int,
    val_size: int,
    seed: int,
    system_prompt: str | None,
    val_field: str = "val_size",
) -> tuple[Path, Path, int]:
    """Write `folder/rl_train.parquet` (`train_size` rows of `tasks`, mixture seed `seed`) and
    `folder/rl_val.parquet` (`val_size` rows of the same tasks seeded `VAL_SEED_OFFSET` away, none whose
    question is in training); (train path, validation path, validation repeats left out).

    Too few fresh validation problems (a small task repeats itself) is a ConfigError naming `val_field`.
    """
    train_rows = [_with_system(r, system_prompt) for r in rows(tasks, train_size, seed, system_prompt=None)]
    seen = {_question(r) for r in train_rows}
    val_tasks = [GymTask(t.name, t.config, t.seed + VAL_SEED_OFFSET, t.size, t.weight) for t in tasks]
    candidates = rows(val_tasks, 2 * val_size, seed + VAL_SEED_OFFSET, system_prompt=None)
    fresh = [_with_system(r, system_prompt) for r in candidates if _question(r) not in seen]
    if len(fresh) < val_size:
        raise ConfigError(
            val_field,
            f"only {len(fresh)} of {2 * val_size} validation problems drawn are not in training",
            "ask for fewer validation rows, or give the tasks more room (a larger size, harder settings)",
        )
    folder = Path(folder)
    train = write_parquet(train_rows, folder / RL_FILES[0])
    val = write_parquet(fresh[:val_size], folder / RL_FILES[1])
    repeats = sum(_question(r) in seen for r in candidates[:val_size])
    return train, val, repeats


def write_config_sets(data: DataConfig, folder: str | Path) -> tuple[Path, Path]:
    """`data.reasoning_gym`'s mixture as `folder/reasoning_gym/rl_train.parquet` and `rl_val.parquet`
    (`data.builtin_train_size` and `builtin_val_size` rows, mixture drawn with `data.seed`); their paths."""
    section = data.reasoning_gym
    size = max(data.builtin_train_size, 2 * data.builtin_val_size)
    tasks = config_tasks(section, data.seed, size)
    system = resolve_system_prompt(section.system_prompt)
    train, val, _ = write_rl_sets(
        Path(folder) / FOLDER,
        tasks,
        data.builtin_train_size,
        data.builtin_val_size,
        data.seed,
        system,
        val_field="data.builtin_val_size",
    )
    return train, val


def sft_rows(rl_rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Worked examples of RL rows (`rows`' layout): the prompt's messages, then the assistant's
    `<answer>X</answer>` with the row's answer; `ground_truth` and `data_source` kept for
    `sft.keep_verified`."""
    out = []
    for row in rl_rows:
        answer = str(row["reward_model"]["ground_truth"])
        messages = [*row["prompt"], {"role": "assistant", "content": f"<answer>{answer}</answer>"}]
        out.append({"messages": messages, "ground_truth": answer, "data_source": row["data_source"]})
    return out
