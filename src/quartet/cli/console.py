"""The console of the commands that print progress lines (train, sft, demo, export), and their quiet.

A log file or a pipe is not a terminal, so rich lays text out for 80 columns and wraps a long metrics line
mid-record: `ppo_kl` at the end of one line, its value at the start of the next, which breaks reading and
grepping the log. Off a terminal, a printed line therefore stays one line (soft wrap); on a terminal rich
wraps to its width as before.

The same console shows quartet's own progress only: transformers' info/warning logs and tqdm download bars
would interleave with it and bury it, so every command that loads models silences the same things
(`quiet_transformers`).
"""

from __future__ import annotations

import logging

from rich.console import Console

__all__ = ["command_console", "quiet_transformers"]


def command_console() -> Console:
    """A console without emoji codes (":1234:" in an error is not an emoji) or highlighting, whose lines
    are not wrapped when it writes to a file or a pipe (module docstring)."""
    console = Console(highlight=False, emoji=False)
    console.soft_wrap = not console.is_terminal
    return console


def quiet_transformers() -> None:
    """Only errors from transformers' loggers, and no progress bars (transformers' nor the hub's)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity(logging.ERROR)
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
