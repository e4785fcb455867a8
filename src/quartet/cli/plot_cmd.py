"""`quartet plot RUN_DIR [--out PNG]`: a PNG of a run's curves (score, length, KL, entropy, timing).

Reads `RUN_DIR/metrics.jsonl`; writes `RUN_DIR/plots.png` unless `--out` says otherwise. Needs matplotlib
(`pip install 'quartet[tracking]'`). Exit status: 0 written, 1 no metrics file or matplotlib missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("plot", help="PNG of a run's metrics: score, length, KL, entropy, timing")
    parser.add_argument("run_dir", help="run folder holding metrics.jsonl (trainer.output_dir/experiment)")
    parser.add_argument("--out", help="PNG path (default: RUN_DIR/plots.png)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from quartet.tracking import TrackerUnavailableError
    from quartet.tracking.plot import plot_run

    try:
        out = plot_run(Path(args.run_dir), Path(args.out) if args.out else None)
    except (FileNotFoundError, TrackerUnavailableError) as err:
        print(f"plot error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
