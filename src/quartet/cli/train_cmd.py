"""`quartet train [CONFIG] [key=value ...]`: an RL run (PPO with a critic, GRPO and the critic-free kin).

The config is loaded and validated before anything starts: a typo or a batch size that does not divide
stops here with the dotted key and the fix, and no Ray actor is created. Exit status: 0 done, 1 the run
failed (bad data, a worker error), 2 the config is invalid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quartet.config import ConfigError, QuartetConfig, load_config

__all__ = ["add_parser", "format_step", "run"]

_STEP_KEYS = (
    ("critic/score/mean", "score", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/pg_loss", "pg_loss", "{:+.4f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("actor/ppo_kl", "ppo_kl", "{:+.4f}"),
    ("actor/grad_norm", "grad_norm", "{:.3f}"),
    ("critic/vf_loss", "vf_loss", "{:.4f}"),
    ("rollout/logprob_diff_mean", "lp_diff", "{:.1e}"),
    ("timing_s/step", "step_s", "{:.2f}"),
    ("perf/throughput", "tok/s", "{:.0f}"),
)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("train", help="RL training (PPO, GRPO, RLOO, ...) as the config says")
    parser.add_argument("config", nargs="?", help="YAML config file (default: the built-in demo config)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.adv_estimator=gae")
    parser.set_defaults(run=run)


def format_step(rec: dict[str, Any]) -> str:
    """One compact line of the step's main metrics."""
    parts = [f"step {rec['step']:>4}"]
    parts += [f"{label} {fmt.format(rec[key])}" for key, label, fmt in _STEP_KEYS if key in rec]
    return "  ".join(parts)


def format_val(rec: dict[str, Any]) -> str:
    scores = [f"{k.removeprefix('val-core/')} {v:.3f}" for k, v in rec.items() if k.startswith("val-core/")]
    return f"val  step {rec['step']:>4}  " + "  ".join(scores)


def _split_args(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """A first positional with '=' is an override, not a config file."""
    if args.config is not None and "=" in args.config:
        return None, [args.config, *args.overrides]
    return args.config, list(args.overrides)


def run(args: argparse.Namespace) -> int:
    path, overrides = _split_args(args)
    try:
        cfg: QuartetConfig = load_config(path, overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    from rich.console import Console
    from transformers.utils import logging as hf_logging

    from quartet.trainer import RLTrainer

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    console = Console(highlight=False)
    console.rule(f"[bold]quartet train: {cfg.algorithm.adv_estimator} on {cfg.cluster.backend}")

    def show(rec: dict[str, Any]) -> None:
        if rec["kind"] == "step":
            console.print(format_step(rec))
        elif rec["kind"] == "val":
            console.print(format_val(rec))
        elif rec["kind"] == "resume":
            console.print(f"[bold]{rec['note']}")
        elif rec["kind"] == "data":
            console.print(f"data  train: {rec['train']}")

    try:
        result = RLTrainer(cfg, on_record=show).run()
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        console.print(f"[red]run failed:[/red] {err}")
        return 1
    console.print(f"done: {result.steps} steps in {result.seconds:.1f} s; run folder {result.run_dir}")
    return 0
