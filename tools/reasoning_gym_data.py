"""Write reasoning-gym tasks as quartet's RL prompt files (verl's parquet layout), for `data.train_files`.

    .venv/bin/python tools/reasoning_gym_data.py OUT_DIR --task leg_counting --task basic_arithmetic:2 \\
        [--config basic_arithmetic='{"max_terms": 3}'] [--train 2000] [--val 200] [--seed 0]

`--task NAME[:WEIGHT]` (repeatable) names a reasoning-gym dataset and its share of the mixture;
`--config NAME=JSON` its difficulty settings. Writes OUT_DIR/rl_train.parquet (each task's dataset seeded
`--seed`) and OUT_DIR/rl_val.parquet (seeded `--seed + VAL_SEED_OFFSET`: reasoning-gym seeds entry i of
seed s with s + i, so nearby seeds share problems), leaving out, and counting, validation problems whose
question is also in training (small tasks repeat themselves). The rows' data_source is
`reasoning_gym/<task>`, which quartet's rule scorer scores with reasoning-gym's own verifier
(`quartet.environments.reasoning_gym`); rewards are logged per data source.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quartet.environments.reasoning_gym import GymTask
from quartet.environments.reasoning_gym_files import VAL_SEED_OFFSET, resolve_system_prompt, write_rl_sets

__all__ = ["VAL_SEED_OFFSET", "main", "parse_tasks"]


def parse_tasks(tasks: list[str], configs: list[str], seed: int, size: int) -> list[GymTask]:
    """`NAME[:WEIGHT]` and `NAME=JSON` flags as `GymTask`s; ValueError names a malformed flag."""
    config = {}
    for item in configs:
        name, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"--config {item!r}: expected NAME=JSON")
        config[name] = json.loads(text)
    out = []
    for item in tasks:
        name, _, weight = item.partition(":")
        out.append(GymTask(name, config.get(name, {}), seed=seed, size=size, weight=float(weight or 1.0)))
    return out


def main(argv: list[str] | None = None) -> tuple[Path, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--task", action="append", required=True, metavar="NAME[:WEIGHT]")
    parser.add_argument("--config", action="append", default=[], metavar="NAME=JSON")
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    size = max(args.train, 2 * args.val)
    tasks = parse_tasks(args.task, args.config, args.seed, size)
    system = resolve_system_prompt("default")
    train, val, repeats = write_rl_sets(
        args.out_dir, tasks, args.train, args.val, args.seed, system, val_field="--val"
    )
    left_out = f"{repeats} repeats of training left out"
    print(f"wrote {train} ({args.train} rows) and {val} ({args.val} rows; {left_out})")
    return train, val


if __name__ == "__main__":
    main()
