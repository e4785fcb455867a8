"""`quartet export CHECKPOINT OUT [--lora merge|adapter]`: a checkpoint's policy as a Hugging Face folder.

CHECKPOINT is a `.../checkpoints/global_step_N` folder or a run folder (its latest checkpoint). Exit status:
0 written, 1 the checkpoint cannot be exported (the message says why).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from quartet.cli.console import quiet_transformers

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("export", help="write a checkpoint's policy as a Hugging Face model folder")
    parser.add_argument("checkpoint", type=Path, help="a global_step_N folder, or a run folder (latest)")
    parser.add_argument("out", type=Path, help="output folder")
    parser.add_argument(
        "--lora",
        choices=["merge", "adapter"],
        default="merge",
        help="LoRA runs: merge the adapter into the weights (default) or save the adapter alone",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from quartet.trainer.recovery.checkpoint import CheckpointError
    from quartet.trainer.recovery.export import export_checkpoint

    quiet_transformers()
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.lora)
    except (CheckpointError, ValueError, FileNotFoundError) as err:
        print(f"export failed: {err}")
        return 1
    print(f"exported {args.checkpoint} -> {out}")
    return 0
