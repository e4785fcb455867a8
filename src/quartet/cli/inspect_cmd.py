"""`quartet inspect RUN_DIR [--port P] [--host H] [--compare OTHER_RUN ...]`: a local page over a run.

Serves, read-only, the run's curves (those of `quartet plot`, interactive), the samples of every recorded
step (`trainer.rollout_freq`) with filters, sort and search, one sample token by token coloured by a chosen
value, the samples of one prompt side by side, and the same prompt in another run or at another step.
Binds 127.0.0.1 unless `--host` says otherwise. Works while the run is going: new steps appear.
Exit status: 0 after Ctrl-C, 1 when a folder is not a run folder or the port is taken.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("inspect", help="a local page: a run's curves and rollouts, token by token")
    parser.add_argument("run_dir", help="run folder (trainer.output_dir/project_name/experiment_name)")
    parser.add_argument(
        "--compare", nargs="*", default=[], metavar="OTHER_RUN", help="run folders to compare with"
    )
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765)")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from quartet.inspector import RunNotFoundError
    from quartet.inspector.server import build_app, serve

    dirs = [Path(args.run_dir), *(Path(p) for p in args.compare)]
    try:
        build_app(dirs)  # every folder checked before the server binds
    except RunNotFoundError as err:
        print(f"inspect error: {err}", file=sys.stderr)
        return 1
    print(f"quartet inspect: http://{args.host}:{args.port}/  (Ctrl-C stops)", flush=True)
    try:
        serve(dirs, args.host, args.port)
    except OSError as err:
        print(
            f"inspect error: cannot serve on {args.host}:{args.port}: {err}. Fix: pass another --port",
            file=sys.stderr,
        )
        return 1
    return 0
