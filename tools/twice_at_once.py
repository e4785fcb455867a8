"""Run the same tests twice at the same time on this machine: both copies must pass.

    .venv/bin/python tools/twice_at_once.py                        # tests/agents_tools and tests/cluster
    .venv/bin/python tools/twice_at_once.py -- -m "not slow" tests/agents_tools
    make test-twice                                                # the same as the first line

Why: a test that counts, signals or cleans up processes, ports, uids or files on the whole host (every
`sandbox_boot.py`, every process of a sandbox uid, `ray stop`) passes alone and fails, or harms the other
run, as soon as a second copy of the suite, a second checkout or another user's job shares the machine.
Each test must touch only what it started; two copies at once is the plainest check of that.

The copies differ only in what is theirs by construction: pytest's base temp folder and Ray's temp folder
(`RAY_TMPDIR`, short, since Ray's socket paths must stay under ~107 characters). Each runs in a session of
its own, so this script stops exactly its own processes however it ends. The output of copy N goes to
`<work folder>/copy-N.log`; the tail of a failing copy's log is printed. The last line is one summary, e.g.

    twice at once: copy 1 exit 0 (118 passed, 3 skipped), copy 2 exit 0 (118 passed, 3 skipped) in 412 s

and the exit status is 0 only when every copy passed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from test_under_load import stop_tree, summary_of

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TESTS = ["tests/agents_tools", "tests/cluster"]
_TAIL_LINES = 60


def start_copy(index: int, work: Path, ray_tmp: Path, pytest_args: list[str]) -> subprocess.Popen[str]:
    """Copy `index` of pytest with its own temp folders, in a session of its own, output to its log."""
    base = work / f"copy-{index}"
    base.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = str(ray_tmp)
    log = (work / f"copy-{index}.log").open("w")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={base / 'pytest'}"]
    return subprocess.Popen(
        [*argv, *pytest_args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def run_copies(pytest_args: list[str], work: Path, ray_tmps: list[Path]) -> list[int]:
    """Start one copy per Ray folder at once, wait for all; their exit statuses (each copy is stopped
    whole, its session, if this script is stopped)."""
    procs: list[subprocess.Popen[str]] = []
    try:
        for index, ray_tmp in enumerate(ray_tmps, 1):
            procs.append(start_copy(index, work, ray_tmp, pytest_args))
        return [proc.wait() for proc in procs]
    finally:
        for proc in procs:
            stop_tree(proc)


def report(codes: list[int], work: Path, elapsed: float) -> str:
    """Print the tail of each failing copy's log; the one-line summary."""
    parts = []
    for index, code in enumerate(codes, 1):
        output = (work / f"copy-{index}.log").read_text(errors="replace")
        if code != 0:
            print(f"----- copy {index} (exit {code}), last {_TAIL_LINES} lines -----")
            print("\n".join(output.splitlines()[-_TAIL_LINES:]))
        parts.append(f"copy {index} exit {code} ({summary_of(output)})")
    return f"twice at once: {', '.join(parts)} in {elapsed:.0f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--copies", type=int, default=2, help="copies of pytest to run at the same time")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, temp folders)")
    parser.add_argument(
        "pytest_args", nargs="*", help=f"passed to pytest (after --); default {DEFAULT_TESTS}"
    )
    args = parser.parse_args()
    if args.copies < 2:
        parser.error("--copies must be at least 2")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a CI timeout ends the copies too (finally)
    work = Path(tempfile.mkdtemp(prefix="quartet-twice-"))
    # short folders directly under /tmp: Ray's socket paths live under them
    ray_tmps = [Path(tempfile.mkdtemp(prefix=f"q2x{i}", dir="/tmp")) for i in range(1, args.copies + 1)]
    start = time.monotonic()
    try:
        codes = run_copies(args.pytest_args or DEFAULT_TESTS, work, ray_tmps)
        line = report(codes, work, time.monotonic() - start)
    finally:
        if not args.keep:
            for folder in [work, *ray_tmps]:
                shutil.rmtree(folder, ignore_errors=True)
    print(line)
    sys.exit(0 if all(code == 0 for code in codes) else 1)


if __name__ == "__main__":
    main()
