"""Built-in tasks: seeded problem generators with exact verifiers, and their RL and chat data sets.

Each task module has `DATA_SOURCE`, a spec dataclass, `compute_score(solution_str, ground_truth,
extra_info=None) -> float` (verl's reward-function form), `write_rl_set` (verl-layout parquet whose
validation problems never occur in training) and `write_sft_set` (chat set of worked answers). `TASKS`
describes them with one typed `Task` record each, keyed by the config's `BuiltinTask` enum (not by free
strings), so the trainer and the reward layer reach a task's functions through attributes.

Where the package sits: it imports `quartet.config` and `quartet.agents` (the calculator and python tools
and the guessing game's simulated user are general agent tools that the tasks render and replay, not
task code), never `quartet.data` or `quartet.rewards`; both of those import it (data's converters for
the row layout, `quartet.tasks.rows`; the rule scorer for the verifiers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from quartet.config.data import BuiltinTask, DataConfig
from quartet.tasks import arithmetic, calculator, countdown, counting, guessing, shapes, word_problems
from quartet.tasks.arithmetic import ArithmeticProblem, ArithmeticSpec, verify_answer
from quartet.tasks.calculator import CalculatorSpec
from quartet.tasks.countdown import CountdownProblem, CountdownSpec
from quartet.tasks.counting import CountingSpec
from quartet.tasks.guessing import GuessingSpec
from quartet.tasks.shapes import ShapesSpec
from quartet.tasks.word_problems import WordProblemSpec

__all__ = [
    "TASKS",
    "ArithmeticProblem",
    "ArithmeticSpec",
    "CalculatorSpec",
    "CountdownProblem",
    "CountdownSpec",
    "CountingSpec",
    "GuessingSpec",
    "Scorer",
    "ShapesSpec",
    "Task",
    "resolve_data_files",
    "task_scorer",
    "WordProblemSpec",
    "builtin_spec",
    "verify_answer",
    "write_builtin",
]

Scorer = Callable[..., float]
"""`(solution_str, ground_truth, extra_info=None) -> float`: verl's reward-function form."""

SpecT = TypeVar("SpecT")
SetWriter = Callable[[str | Path, SpecT, int, int, int], tuple[Path, Path]]


@dataclass(frozen=True)
class Task(Generic[SpecT]):
    """One built-in task's entry points."""

    name: BuiltinTask
    data_source: str
    """The `data_source` of its rows; selects `compute_score`."""
    default_spec: SpecT
    """The spec `write_builtin` uses (sized for the default `data.builtin_val_size`)."""
    compute_score: Scorer
    verify_answer: Callable[[str, str], bool]
    write_rl_set: SetWriter[SpecT]
    """`(folder, spec, train_size, val_size, seed) -> (train parquet, val parquet)`, verl layout."""
    write_sft_set: SetWriter[SpecT]
    """`(folder, spec, train_size, val_size, seed) -> (train parquet, val parquet)`, `messages` column."""


TASKS: dict[BuiltinTask, Task[Any]] = {
    BuiltinTask.ARITHMETIC: Task(
        BuiltinTask.ARITHMETIC,
        arithmetic.DATA_SOURCE,
        # One-digit + - *: 300 problems, room for the default 128 held-out ones (at most half may be).
        ArithmeticSpec(digits=1, operations=("+", "-", "*")),
        arithmetic.compute_score,
        arithmetic.verify_answer,
        arithmetic.write_rl_set,
        arithmetic.write_sft_set,
    ),
    BuiltinTask.COUNTDOWN: Task(
        BuiltinTask.COUNTDOWN,
        countdown.DATA_SOURCE,
        CountdownSpec(),
        countdown.compute_score,
        countdown.verify_answer,
        countdown.write_rl_set,
        countdown.write_sft_set,
    ),
    BuiltinTask.CALCULATOR: Task(
        BuiltinTask.CALCULATOR,
        calculator.DATA_SOURCE,
        CalculatorSpec(),
        calculator.compute_score,
        calculator.verify_answer,
        calculator.write_rl_set,
        calculator.write_sft_set,
    ),
    BuiltinTask.WORD_PROBLEMS: Task(
        BuiltinTask.WORD_PROBLEMS,
        word_problems.DATA_SOURCE,
        WordProblemSpec(),
        word_problems.compute_score,
        word_problems.verify_answer,
        word_problems.write_rl_set,
        word_problems.write_sft_set,
    ),
    BuiltinTask.GUESSING: Task(
        BuiltinTask.GUESSING,
        guessing.DATA_SOURCE,
        GuessingSpec(),
        guessing.compute_score,
        guessing.verify_answer,
        guessing.write_rl_set,
        guessing.write_sft_set,
    ),
    BuiltinTask.COUNTING: Task(
        BuiltinTask.COUNTING,
        counting.DATA_SOURCE,
        CountingSpec(),
        counting.compute_score,
        counting.verify_answer,
        counting.write_rl_set,
        counting.write_sft_set,
    ),
    BuiltinTask.SHAPES: Task(
        BuiltinTask.SHAPES,
        shapes.DATA_SOURCE,
        ShapesSpec(),
        shapes.compute_score,
        shapes.verify_answer,
        shapes.write_rl_set,
        shapes.write_sft_set,
    ),
}


def builtin_spec(task: BuiltinTask, digits: int, sloppy: float = 0.0) -> Any:
    """The spec of a multi-turn task's problems with operands of `digits` digits (the guessing game's
    range is its default: digits do not apply); `sloppy`: the share of SFT traces from a weaker
    demonstrator (the calculator's and word problems' answers from the head, the guessing game's random
    players); counting's and shapes' default specs (digits do not apply to them); None for the other
    single-turn tasks (their callers build them)."""
    if task is BuiltinTask.CALCULATOR:
        return CalculatorSpec(digits=digits, sloppy=sloppy)
    if task is BuiltinTask.WORD_PROBLEMS:
        return WordProblemSpec(digits=digits, sloppy=sloppy)
    if task is BuiltinTask.GUESSING:
        return GuessingSpec(sloppy=sloppy)
    if task in (BuiltinTask.COUNTING, BuiltinTask.SHAPES):
        return TASKS[task].default_spec
    return None


def task_scorer(data_source: str) -> Scorer | None:
    """The built-in task scorer of rows with this `data_source`, or None when no built-in task has it."""
    for task in TASKS.values():
        if task.data_source == data_source:
            return task.compute_score
    return None


def write_builtin(
    task: BuiltinTask, folder: str | Path, train_size: int, val_size: int, seed: int, spec: Any = None
) -> tuple[Path, Path]:
    """Write the task's RL train/val parquet files under `folder/<task>/`; their paths.

    `spec` defaults to the task's `default_spec`. The files are regenerated on every call: they are a
    deterministic function of (spec, sizes, seed), so a resumed run reads the same rows.
    """
    entry = TASKS[BuiltinTask(task)]
    return entry.write_rl_set(
        Path(folder) / entry.name.value, spec or entry.default_spec, train_size, val_size, seed
    )


def resolve_data_files(cfg: DataConfig, folder: str | Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train files, validation files) of a run: `data.train_files` / `data.val_files`, or, when
    `train_files` is empty, the built-in task written under `folder` (its validation split unless
    `val_files` names other files)."""
    if cfg.train_files:
        return tuple(cfg.train_files), tuple(cfg.val_files)
    if cfg.reasoning_gym.tasks:  # the environments layer writes those, above this one
        raise ValueError(
            "data.reasoning_gym.tasks is set: its files come from quartet.environments."
            "reasoning_gym_files.write_config_sets(cfg, folder), not from the built-in tasks"
        )
    train, val = write_builtin(
        cfg.builtin_task, folder, cfg.builtin_train_size, cfg.builtin_val_size, cfg.seed
    )
    return (str(train),), tuple(cfg.val_files) or (str(val),)
