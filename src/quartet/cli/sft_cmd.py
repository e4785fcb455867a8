"""`quartet sft [--config FILE] [key=value ...]`: supervised fine-tuning on chat conversations.

With no data files it trains the tiny default model on the built-in arithmetic chat set and reports the
greedy exact-match accuracy on held-out problems before and after. Exit status: 0 done, 1 the run failed
(bad data, a worker error), 2 the config is invalid.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quartet.cli.console import command_console, quiet_transformers
from quartet.config import ConfigError, QuartetConfig, load_config, sft_rules
from quartet.config.errors import raise_problems

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_parser", "load_sft_config", "run", "sft_progress"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("sft", help="supervised fine-tuning on chat data (default: built-in arithmetic)")
    parser.add_argument("--config", "-c", help="YAML config file")
    parser.add_argument("--log-every", type=int, default=20, help="print every this many steps (default 20)")
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. sft.optim.lr=1e-5 sft.train_files=[train.jsonl]"
    )
    parser.set_defaults(run=run)


def load_sft_config(path: str | None, overrides: list[str]) -> QuartetConfig:
    """The validated config, including the SFT cross-field rules."""
    cfg = load_config(path, overrides)
    problems = sft_rules(cfg)
    raise_problems(problems)
    return cfg


def sft_progress(console: Console, every: int, val_every: int = 1) -> Callable[[dict[str, Any]], None]:
    """The sft progress printer: every `every`-th train step (and the first), the validation of every
    `val_every`-th epoch, data, eval and export records, one line each."""

    def show(rec: dict[str, Any]) -> None:
        kind = rec["kind"]
        if kind == "train" and (rec["step"] == 1 or rec["step"] % every == 0):
            console.print(
                f"step {rec['step']:>5}  epoch {rec['epoch']}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                f"grad_norm {rec['grad_norm']:.3f}  tokens {rec['tokens']}  {rec['seconds'] * 1e3:.0f} ms"
            )
        elif kind == "val" and rec["epoch"] % val_every == 0:
            console.print(f"val    epoch {rec['epoch']}  step {rec['step']}  val_loss {rec['val_loss']:.4f}")
        elif kind == "data":
            console.print(
                f"data   {rec['split']}: {rec['rows']} rows, {rec['kept']} kept, "
                f"{rec['malformed']} malformed, {rec['overlong_filtered']} overlong filtered, "
                f"{rec['truncated']} truncated"
            )
        elif kind == "eval":
            console.print(
                f"eval   {rec['phase']} training: exact match {rec['correct']}/{rec['total']} "
                f"= {rec['accuracy']:.1%}  ({rec['seconds']} s)"
            )
        elif kind == "export":
            console.print(f"export {rec['hf_dir']}", markup=False)

    return show


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_sft_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    from quartet.sft import SFTTrainer

    quiet_transformers()
    console = command_console()
    console.rule("[bold]quartet sft")
    try:
        result = SFTTrainer(cfg, on_record=sft_progress(console, max(1, args.log_every))).run()
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        console.print(f"sft failed: {err}", style="bold red", markup=False, soft_wrap=True)
        return 1
    s = result.summary()
    acc = (
        f"{s['accuracy_before']:.1%} -> {s['accuracy_after']:.1%} on {s['eval_samples']} held-out"
        if s["accuracy_after"] is not None
        else "not measured (no validation data)"
    )
    console.rule("[green]sft done")
    console.print(f"steps     {s['steps']}")
    console.print(f"loss      {s['loss_first']:.4f} -> {s['loss_last']:.4f}")
    if s["val_losses"]:
        console.print(f"val loss  {' -> '.join(f'{v:.4f}' for v in s['val_losses'])}")
    console.print(f"accuracy  {acc}")
    console.print(f"time      {s['seconds']:.1f} s")
    console.print(f"run dir   {s['run_dir']} (metrics.jsonl, summary.json)", markup=False)
    console.print(f"model     {s['hf_dir']}", markup=False)
    return 0
