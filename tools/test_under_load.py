"""Run the test suite while other processes keep cores busy: what a user's machine looks like.

    .venv/bin/python tools/test_under_load.py                 # `pytest -q` with one core kept busy
    .venv/bin/python tools/test_under_load.py --busy 2 -- -m "not slow" tests/serving
    make test-under-load                                      # the same as the first line

Each busy process is a plain Python spin loop (one core each, at normal priority, so it competes with the
tests as another user's job would). The busy processes are stopped however the run ends (a finally
block, and their own watchdog: each exits on its own when its parent is gone). The last line printed is
one summary, e.g.

    under load (1 busy process, 2 CPUs): pytest exit 0 in 1264 s; 1045 passed, 12 skipped; load avg 3.1

and the exit status is pytest's. `--repeat N` runs the suite N times in a row and prints one such line
per run (the issue asks for 3 runs of 3).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A spin loop that exits when its parent (this script) is gone: no orphan keeps a core busy.
SPIN = """
import os, time
parent = os.getppid()
deadline = time.monotonic()
while True:
    if time.monotonic() >= deadline:
        if os.getppid() != parent:
            break
        deadline = time.monotonic() + 1.0
"""


def start_busy(count: int) -> list[subprocess.Popen[bytes]]:
    """`count` spin-loop processes, one core each."""
    return [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(count)]


def stop_busy(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait(timeout=10)


def summary_of(output: str) -> str:
    """pytest's final counts line (`1045 passed, 12 skipped in ...`), without the timing part."""
    for line in reversed(output.splitlines()):
        if re.search(r"\b(passed|failed|error|errors|skipped|deselected)\b", line):
            return re.sub(r"\s+in\s+[\d.]+s.*$", "", line.strip("= ").strip())
    return "no pytest summary line"


def stop_tree(proc: subprocess.Popen[str]) -> None:
    """End pytest and whatever it started (its own session): SIGTERM, then SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_once(pytest_args: list[str], busy: int) -> tuple[int, str]:
    """Run pytest once under `busy` spinning processes; its exit status and a one-line summary."""
    procs = start_busy(busy)
    start = time.monotonic()
    proc: subprocess.Popen[str] | None = None
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-q", *pytest_args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # stopped as a group if this script is stopped
        )
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # echo as it runs, keep it for the summary
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
        code = proc.wait()
    finally:
        if proc is not None:
            stop_tree(proc)
        stop_busy(procs)
    elapsed = time.monotonic() - start
    load = os.getloadavg()[0]
    cpus = os.cpu_count()
    line = (
        f"under load ({busy} busy process{'es' if busy != 1 else ''}, {cpus} CPUs): pytest exit {code} in "
        f"{elapsed:.0f} s; {summary_of(''.join(lines))}; load avg {load:.1f}"
    )
    return code, line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--busy", type=int, default=1, help="spinning processes to run beside the suite")
    parser.add_argument("--repeat", type=int, default=1, help="run the suite this many times in a row")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args()
    if args.busy < 0 or args.repeat < 1:
        parser.error("--busy must be >= 0 and --repeat >= 1")
    # SIGTERM (a CI timeout, `kill`) ends the run through the finally blocks: no orphaned pytest or spinner
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = [run_once(args.pytest_args, args.busy) for _ in range(args.repeat)]
    print()
    for i, (_, line) in enumerate(results, 1):
        print(f"run {i}/{args.repeat}: {line}")
    sys.exit(max(code for code, _ in results))


if __name__ == "__main__":
    main()
