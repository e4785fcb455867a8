"""`quartet train [CONFIG] [key=value ...]`: an RL run (PPO with a critic, GRPO and the critic-free kin).

The config is loaded and validated before anything starts: a typo or a batch size that does not divide
stops here with the dotted key and the fix, and no Ray actor is created. Exit status: 0 done, 1 the run
failed (bad data, a worker error), 2 the config is invalid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quartet.cli.console import command_console, quiet_transformers
from quartet.config import Backend, ConfigError, QuartetConfig, load_config

__all__ = ["add_parser", "run", "split_config_args"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("train", help="RL training (PPO, GRPO, RLOO, ...) as the config says")
    parser.add_argument("config", nargs="?", help="YAML config file (default: the built-in demo config)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.adv_estimator=gae")
    parser.set_defaults(run=run)


_TRAINER_MODULES = ("quartet.trainer", "rich.console")


def _starts_ray_now(cfg: QuartetConfig) -> bool:
    """Start Ray while the trainer is imported: for a Ray run that starts its own local Ray (joining a
    running cluster takes ~0.4 s, too little to hide) and goes straight to RL (an SFT warm start trains
    first, in this process, and would leave Ray idle meanwhile), in a process that has not imported the
    trainer yet (else there is nothing to overlap, and the run connects as it always did)."""
    if "quartet.trainer" in sys.modules or cfg.cluster.backend != Backend.RAY or cfg.trainer.sft_warm_start:
        return False
    from quartet.cluster.connect import resolve_target

    c = cfg.cluster
    return resolve_target(c.address, min(c.connect_timeout_s, 5.0)).mode == "start"


def split_config_args(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """A first positional with '=' is an override, not a config file."""
    if args.config is not None and "=" in args.config:
        return None, [args.config, *args.overrides]
    return args.config, list(args.overrides)


def run(args: argparse.Namespace) -> int:
    path, overrides = split_config_args(args)
    try:
        cfg: QuartetConfig = load_config(path, overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    try:
        if _starts_ray_now(cfg):  # Ray starts on this thread while another imports the trainer
            from quartet.cluster.ray_session import connect_while_importing

            connect_while_importing(cfg.cluster, _TRAINER_MODULES)
    except (ConnectionError, RuntimeError, ValueError) as err:
        print(f"run failed: {err}", file=sys.stderr)
        return 1
    from quartet.tracking import TrackerUnavailableError
    from quartet.trainer import RLTrainer

    quiet_transformers()
    console = command_console()
    console.rule(f"[bold]quartet train: {cfg.algorithm.adv_estimator} on {cfg.cluster.backend}")

    try:
        if cfg.trainer.sft_warm_start:
            from quartet.trainer.loop.warm_start import sft_warm_start

            console.print("sft warm start (trainer.sft_warm_start): the sft section first", markup=False)
            cfg, start, trained = sft_warm_start(cfg)
            what = "trained" if trained else "found, reused"
            console.print(f"sft warm start {what}: RL starts from {start}", markup=False)
        result = RLTrainer(cfg, console=console).run()
    except (ValueError, FileNotFoundError, RuntimeError, ConnectionError, TrackerUnavailableError) as err:
        # markup=False: an error text may hold rich tags, e.g. gloo's "[/__w/.../pair.cc:537] Read error"
        console.print(f"run failed: {err}", style="red", markup=False, soft_wrap=True)
        return 1
    console.print(
        f"done: {result.steps} steps in {result.seconds:.1f} s; run folder {result.run_dir}", markup=False
    )
    return 0
