"""`quartet` command: dispatches to one module per subcommand."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from quartet import __version__
from quartet.cli import (
    check_cmd,
    config_cmd,
    demo,
    doctor,
    export_cmd,
    inspect_cmd,
    plan_cmd,
    plot_cmd,
    serve_cmd,
    sft_cmd,
    train_cmd,
)

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quartet", description="RL post-training of language models on Ray."
    )
    parser.add_argument("--version", action="version", version=f"quartet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    check_cmd.add_parser(sub)
    config_cmd.add_parser(sub)
    demo.add_parser(sub)
    doctor.add_parser(sub)
    export_cmd.add_parser(sub)
    inspect_cmd.add_parser(sub)
    plan_cmd.add_parser(sub)
    plot_cmd.add_parser(sub)
    serve_cmd.add_parser(sub)
    sft_cmd.add_parser(sub)
    train_cmd.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except BrokenPipeError:  # `quartet config show --doc | head`: the reader left, which is no error
        _quiet_closed_stdout()
        return 0
    return code


def _quiet_closed_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's flush at exit does not raise again into the
    closed pipe (the recipe of Python's `signal` documentation)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
