"""`quartet demo [--task T] [--model dense|moe] [--quick] [--seed N] [--device cpu|gpu] [key=value ...]`:
the main job on the embedded default, on CPU (or, with `--device gpu`, at a GPU size on one CUDA device).

A tiny model built by the code gets an SFT warm start on a few hundred worked 2-digit additions, then GRPO
on fresh problems scored by the verifier, and a control that spends GRPO's training time on more SFT over
the same examples. The table compares greedy accuracy on held-out problems. `--task vision` runs the same
three rows with a tiny vision-language model counting shapes in pictures; `--model moe` the arithmetic demo
with a tiny mixture-of-experts model (docs/moe.md). Exit status: 0 done, 1 the run failed, 2 the config is
invalid or the device is not there.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quartet.cli.console import command_console, quiet_transformers
from quartet.config import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

    from quartet.demo import DemoResult

__all__ = ["add_parser", "run"]

WHAT = {
    "arithmetic": "2-digit addition",
    "calculator": "a*b+c with a calculator tool, multi-turn",
    "vision": "counting circles in pictures",
}
"""The title's task, per `--task`."""

GYM_NOTE = "expected: a few minutes on a 2-core CPU (benchmarks/reasoning_gym_tasks.py times it)"
"""The opening line of `--task reasoning_gym:<name>`."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("demo", help="SFT warm start, then GRPO vs more SFT, on CPU in minutes")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke of the pipeline: every stage runs, too small for the rows to mean anything",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of data, model init and sampling")
    parser.add_argument(
        "--task",
        type=_task,
        default="arithmetic",
        metavar="{arithmetic,calculator,vision,reasoning_gym:<name>}",
        help="arithmetic: 2-digit addition, one turn; calculator: multi-turn, the model calls a tool; "
        "vision: a tiny VLM counts the circles in a picture (its SFT side: vision.<name>=<value>, e.g. "
        "vision.sft_steps=500; see docs/vision.md); reasoning_gym:<name>: a reasoning-gym task, e.g. "
        "reasoning_gym:chain_sum (docs/environments.md)",
    )
    parser.add_argument(
        "--model",
        choices=["dense", "moe"],  # quartet.demo.MODELS
        default="dense",
        help="dense: the tiny Qwen2; moe: a tiny Qwen3-MoE with as many parameters active per token "
        "(8 experts, 2 per token; --task arithmetic on CPU; see docs/moe.md)",
    )
    parser.add_argument(
        "--filtered-control",
        action="store_true",
        help="a fourth row: more SFT for GRPO's time on the traces the verifier accepts only (text tasks)",
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "gpu"],  # quartet.demo.DEVICES
        default="cpu",
        help="cpu: the tiny model; gpu: a ~0.1B model on one CUDA device, under 5 minutes on an H100 "
        "(--task arithmetic only)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides of the demo config, e.g. trainer.total_steps=50"
    )
    parser.set_defaults(run=run)


def _task(text: str) -> str:
    """`--task`'s value: a demo of quartet.demo.DEMOS (not imported: `--help` is fast) or
    `reasoning_gym:<name>` (the name is checked when the config is built)."""
    if text in WHAT or (text.startswith("reasoning_gym:") and len(text) > len("reasoning_gym:")):
        return text
    raise argparse.ArgumentTypeError(
        f"invalid choice: {text!r} (choose from {', '.join(WHAT)}, or reasoning_gym:<name>)"
    )


def _progress(
    console: Console, source: str, sft_every: int = 500, noun: str = "problems"
) -> Callable[[dict[str, Any]], None]:
    """The demo's progress lines: GRPO's steps and validations, every `sft_every`-th SFT step, the exports
    and the held-out scores (of `noun`)."""
    from quartet.tracking.console_sink import format_step, format_val

    def show(rec: dict[str, Any]) -> None:
        kind = rec["kind"]
        if kind == "step" and (rec["step"] == 1 or rec["step"] % 10 == 0):
            console.print("  grpo " + format_step(rec))
        elif kind == "val" and f"val-core/{source}/reward/mean@1" in rec:
            console.print("  grpo " + format_val(rec))
        elif kind == "train" and rec["step"] % sft_every == 0:
            console.print(f"  sft  step {rec['step']:>5}  epoch {rec['epoch']:>3}  loss {rec['loss']:.4f}")
        elif kind == "export":
            console.print(f"  sft  exported {rec['hf_dir']}", markup=False)
        elif kind == "demo_row":
            console.print(f"  eval {rec['name']}: {rec['correct']}/{rec['total']} held-out {noun} right")

    return show


def run(args: argparse.Namespace) -> int:
    from quartet.demo import NO_FILTERED_VISION, cuda_problem, demo_config, run_demo
    from quartet.demo.expectations import closing_note, opening_note

    device = args.device
    if args.task == "vision" and args.filtered_control:
        print(f"config error: {NO_FILTERED_VISION}", file=sys.stderr)
        return 2
    try:
        cfg = demo_config(args.overrides, args.seed, args.quick, args.task, device, args.model)
        if args.task.startswith("reasoning_gym:"):  # an unknown name, refused settings: before any training
            from quartet.environments.reasoning_gym_files import config_tasks

            config_tasks(cfg.data.reasoning_gym, cfg.data.seed, 1)
    except (ConfigError, ValueError) as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    problem = cuda_problem() if device == "gpu" else None
    if problem:  # before any import of the training stack or Ray: a missing GPU costs no time
        print(f"demo: {problem}", file=sys.stderr)
        return 2
    quiet_transformers()
    logging.basicConfig(level=logging.WARNING)
    console = command_console()
    gym = args.task.partition("reasoning_gym:")[2]
    what = WHAT.get(args.task) or f"reasoning-gym's {gym}, scored by its own verifier"
    model = "tiny Qwen2, CPU" if device == "cpu" else "~0.1B Qwen2 shape, GPU"
    model = "tiny Qwen2-VL, CPU" if args.task == "vision" else model
    moe = _moe_model(cfg) if args.model == "moe" else None
    model = f"{moe[0]}, CPU" if moe else model
    flags = f"--task {args.task}" + (f" --model {args.model}" if args.model != "dense" else "")
    console.rule(f"[bold]quartet demo {flags}")  # short: a rule is cut at 80 columns in a log
    console.print(f"SFT start -> GRPO vs more SFT: {model}, {what}", markup=False)
    note = opening_note(args.task, args.quick, device, args.model) if not gym else GYM_NOTE
    console.print(note, markup=False)
    source = f"reasoning_gym/{gym}" if gym else cfg.data.builtin_task.value
    try:
        result = run_demo(
            args.overrides,
            args.seed,
            args.quick,
            _progress(console, source, 50 if args.task == "vision" else 500, _noun(args.task)),
            args.task,
            filtered_control=args.filtered_control,
            device=device,
            model=args.model,
        )
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        # markup=False: an error text may hold rich tags, e.g. gloo's "[/__w/.../pair.cc:537] Read error"
        console.print(f"demo failed: {err}", style="red", markup=False, soft_wrap=True)
        return 1
    _report(console, result, args.seed, _noun(args.task), moe[1] if moe else None)
    closing = closing_note(args.task, args.quick, device, args.model)
    if closing:
        console.print(closing, style="yellow", markup=False)
    return 0


def _moe_model(cfg: Any) -> tuple[str, str]:
    """`--model moe`'s model in words with its active and total parameters (the planner's counts, those
    `quartet plan` prints), so its table reads against the dense demo's ~1.05M parameters: the opening
    line's exact counts, and the table title's rounded ones (a title wider than the table wraps)."""
    from quartet.planning.model_shape import shape_from_tiny

    tiny, shape = cfg.model.tiny, shape_from_tiny(cfg.model.tiny)
    active, total = shape.active_params, shape.total_params
    return (
        f"tiny Qwen3-MoE: {active:,} of {total:,} parameters active "
        f"({tiny.num_experts_per_tok} of {tiny.num_experts} experts)",
        f"tiny Qwen3-MoE: {active / 1e6:.2f}M of {total / 1e6:.2f}M parameters active",
    )


def _noun(task: str) -> str:
    """What the held-out set holds: pictures for `--task vision`, problems otherwise."""
    return "pictures" if task == "vision" else "problems"


def _report(
    console: Console, result: DemoResult, seed: int, noun: str = "problems", model: str | None = None
) -> None:
    """The accuracy table and where the run's files are (the same on CPU and GPU). The table is narrow
    enough for the 80 columns of a log file; the model folders, long paths, follow it one per line. A
    `model` other than the task's default (`--model moe`) heads the title, on a line of its own."""
    from rich.table import Table

    title = f"greedy accuracy on {result.rows[0].total} held-out {noun} (seed {seed})"
    table = Table(title=f"{model}\n{title}" if model else title)
    for column in ("model", "accuracy", "correct", "train time"):
        table.add_column(column, no_wrap=True)
    for row in result.rows:
        table.add_row(
            row.name, f"{row.accuracy:.1%}", f"{row.correct}/{row.total}", f"{row.train_seconds:.0f} s"
        )
    console.print(table, soft_wrap=False)  # a table keeps its layout, in a log file too
    for row in result.rows:
        console.print(f"{row.name + ' model:':<26}{row.model_dir}", markup=False, soft_wrap=True)
    console.print(f"whole demo: {result.seconds:.0f} s; run files under {result.run_dir}", markup=False)
    if result.plot is not None:
        console.print(
            f"GRPO curves (score, length, KL, entropy, time per phase): {result.plot}", markup=False
        )
    if result.grpo_run is not None:
        console.print(
            f"what GRPO's policy wrote, token by token: quartet inspect {result.grpo_run}",
            markup=False,
            soft_wrap=True,  # the command stays on one line, ready to copy
        )
