"""The task registry, arithmetic's RL set and scorer, and the trainer's choice of data files."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from quartet.config.data import BuiltinTask, DataConfig
from quartet.tasks import TASKS, arithmetic, countdown, resolve_data_files, task_scorer, write_builtin


def test_registry_covers_every_builtin_task() -> None:
    assert set(TASKS) == set(BuiltinTask)
    assert task_scorer("arithmetic") is arithmetic.compute_score
    assert task_scorer("countdown") is countdown.compute_score
    assert task_scorer("openai/gsm8k") is None
    for name, task in TASKS.items():
        assert task.name is name and task.data_source == name.value


def test_arithmetic_scorer_and_rl_set(tmp_path: Path) -> None:
    assert arithmetic.compute_score("3+4=7", "7") == 1.0
    assert arithmetic.compute_score("8", "7") == 0.0
    spec = arithmetic.ArithmeticSpec(digits=1, operations=("+", "*"))
    train_path, val_path = arithmetic.write_rl_set(tmp_path, spec, train_size=50, val_size=20, seed=0)
    train, val = pq.read_table(train_path).to_pylist(), pq.read_table(val_path).to_pylist()
    assert (len(train), len(val)) == (50, 20)
    row = train[5]
    (message,) = row["prompt"]
    assert message["role"] == "user" and message["content"].startswith("What is ")
    expression = row["extra_info"]["expression"]
    assert message["content"] == f"What is {expression}?"
    a, op, b = int(expression[0]), expression[1], int(expression[2])
    assert row["reward_model"]["ground_truth"] == str(a + b if op == "+" else a * b)
    assert row["data_source"] == "arithmetic" and row["extra_info"]["index"] == 5
    assert not {r["extra_info"]["expression"] for r in train} & {r["extra_info"]["expression"] for r in val}


def test_write_builtin_and_resolve_data_files(tmp_path: Path) -> None:
    train, val = write_builtin(BuiltinTask.COUNTDOWN, tmp_path, train_size=8, val_size=4, seed=0)
    assert train.parent == tmp_path / "countdown" and pq.read_table(val).num_rows == 4
    cfg = DataConfig(builtin_task=BuiltinTask.ARITHMETIC, builtin_train_size=30, builtin_val_size=128)
    files, val_files = resolve_data_files(cfg, tmp_path)
    assert pq.read_table(files[0]).num_rows == 30 and pq.read_table(val_files[0]).num_rows == 128
    given = DataConfig(train_files=("a.parquet",), val_files=())
    assert resolve_data_files(given, tmp_path) == (("a.parquet",), ())
