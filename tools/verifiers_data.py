"""Write a verifiers environment's datasets as quartet's RL prompt files (verl's parquet layout).

    .venv/bin/python tools/verifiers_data.py OUT_DIR --env ENV_ID [--env-args '{"k": 1}'] \\
        [--train -1] [--val -1] [--seed S]

Loads ENV_ID as `vf.load_environment` does (its module must be importable: an installed package, or its
folder on PYTHONPATH) and writes OUT_DIR/rl_train.parquet from its dataset and OUT_DIR/rl_val.parquet
from its eval dataset (verifiers' own fallback: the train set when it has none; said on the output),
`--train`/`--val` rows each (-1: all), shuffled by `--seed` when given. The rows' data_source is
`env/verifiers/<ENV_ID>` and their agent loop `environment`: train with rollout.multi_turn.enable=true,
and each episode runs in the environment `verifiers` (quartet.environments.verifiers_episode), scored by the
env's rubric.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from quartet.environments.verifiers_env import load, rows
from quartet.tasks.rows import write_parquet


def main(argv: list[str] | None = None) -> tuple[Path, Path]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--env", required=True, metavar="ENV_ID")
    parser.add_argument("--env-args", default="{}", metavar="JSON")
    parser.add_argument("--train", type=int, default=-1)
    parser.add_argument("--val", type=int, default=-1)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        env_args = json.loads(args.env_args)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--env-args {args.env_args!r} is not JSON: {err}") from None
    train_rows = rows(args.env, env_args, "train", args.train, args.seed)
    val_rows = rows(args.env, env_args, "eval", args.val, args.seed)
    if not train_rows or not val_rows:
        raise SystemExit(f"{args.env}: {len(train_rows)} train and {len(val_rows)} eval rows; need both")
    train = write_parquet(train_rows, args.out_dir / "rl_train.parquet")
    val = write_parquet(val_rows, args.out_dir / "rl_val.parquet")
    shared = "" if load(args.env, env_args).eval_dataset is not None else " (no eval set: from train)"
    print(f"wrote {train} ({len(train_rows)} rows) and {val} ({len(val_rows)} rows{shared})")
    return train, val


if __name__ == "__main__":
    main()
