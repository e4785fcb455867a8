"""Metrics lines written to a log file or a pipe stay whole: each metric's name and its value on one line.

rich lays out a non-terminal console at 80 columns; a step line is longer, and used to be wrapped between
a metric's name and its value (`ppo_kl` at the end of one line, `+0.1235` at the start of the next).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from quartet.cli.console import command_console
from quartet.tracking.console_sink import STEP_KEYS

VALUE = 0.123456
STEP = {"kind": "step", "step": 10, **{key: VALUE for key, _, _ in STEP_KEYS}}
TRAIN = {
    "kind": "train",
    "step": 12345,
    "epoch": 3,
    "loss": 0.5,
    "lr": 1e-5,
    "grad_norm": 0.25,
    "tokens": 123456,
    "seconds": 0.123,
}

PRINT_THEM = f"""
from quartet.cli import demo, sft_cmd
from quartet.cli.console import command_console
from quartet.tracking.console_sink import ConsoleSink

sink = ConsoleSink(total_steps=100)  # the tracker's sink, on its own console
sink.log({STEP!r})
sink.close()
console = command_console()  # the commands' console: the demo's and sft's progress lines
demo._progress(console, "arithmetic")({STEP!r})
sft_cmd.sft_progress(console, every=1)({TRAIN!r})
"""


def _piped_output() -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE")}
    out = subprocess.run(
        [sys.executable, "-c", PRINT_THEM],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.splitlines()


def test_metrics_lines_written_to_a_pipe_are_not_wrapped() -> None:
    lines = _piped_output()
    assert len(lines) == 3, lines  # the sink's step line, the demo's step line, sft's train line
    sink_line, demo_line, sft_line = lines
    assert len(demo_line) > 80  # longer than rich's width off a terminal: it would have wrapped
    for line in (sink_line, demo_line):
        for _key, label, fmt in STEP_KEYS:
            assert f"{label} {fmt.format(VALUE)}" in line
    assert demo_line.startswith("  grpo step   10")
    for pair in ("step 12345", "epoch 3", "loss 0.5000", "lr 1.00e-05", "grad_norm 0.250", "tokens 123456"):
        assert pair in sft_line


def test_a_terminal_keeps_its_wrapping(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes the console for a terminal
    console = command_console()
    assert console.is_terminal and not console.soft_wrap  # rich wraps to the terminal's width, as before
