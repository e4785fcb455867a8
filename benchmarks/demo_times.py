"""Wall time of each `quartet demo` a newcomer runs, as the CLI runs it, and the table it printed.

The expected times the demo prints before it starts (`quartet.demo.expectations`) and the README's come from
this file's results: run it on a quiet machine, then copy the rounded seconds there (a test checks that they
agree with `benchmarks/results/demo_times.json`).

    .venv/bin/python benchmarks/demo_times.py                       # the default set, one after another
    .venv/bin/python benchmarks/demo_times.py --only arithmetic:quick
    .venv/bin/python benchmarks/demo_times.py --merge --only arithmetic:quick:moe arithmetic:full:moe

An item is `task:full|quick[:model]` (model: `quartet demo --model`, dense when left out). `--merge` keeps the
runs of the results file that this call does not repeat (same task, size and model), so one demo can be
timed again without the others; the machine block is then this call's, and each run carries the load
average at its end (`load_average_after`; runs recorded before it have none).

Each run is a fresh `quartet demo` process in a scratch output folder; the time is the parent's clock from
spawn to exit. The full calculator and vision demos are not in the default set (7 and ~36 minutes; their
figures come from docs/agentic.md and docs/vision.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, write_result  # noqa: E402

QUARTET = Path(sys.executable).with_name("quartet")
DEFAULT = ("arithmetic:full", "arithmetic:quick", "calculator:quick", "vision:quick")
ROW = re.compile(
    r"^│ (?P<name>[^│]+?) +│ (?P<accuracy>[\d.]+)% +│ (?P<correct>\d+)/(?P<total>\d+) +│ (?P<train_s>\d+) s"
)


def run_one(task: str, quick: bool, seed: int, timeout_s: float, model: str = "dense") -> dict[str, Any]:
    """One demo, start to table: its wall seconds, exit status and the rows it printed."""
    with tempfile.TemporaryDirectory(prefix="demo-times-") as scratch:
        command = [str(QUARTET), "demo", "--task", task, "--model", model, "--seed", str(seed)]
        command += ["--quick"] if quick else []
        command += [f"trainer.output_dir={scratch}"]
        began = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=scratch)
        seconds = time.perf_counter() - began
    rows = [m.groupdict() for m in map(ROW.match, done.stdout.splitlines()) if m]
    if done.returncode != 0 or not rows:
        raise RuntimeError(
            f"{' '.join(command)} failed (rc {done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    load = [round(x, 2) for x in os.getloadavg()]  # per run: `--merge` keeps runs of other calls
    return {"task": task, "quick": quick, "model": model, "seed": seed, "seconds": seconds, "rows": rows,
            "load_average_after": load}  # fmt: skip


def key(run: dict[str, Any]) -> str:
    """`task:full|quick[:model]` of a run (a run recorded before `--model` existed is dense)."""
    model = run.get("model", "dense")
    return f"{run['task']}:{'quick' if run['quick'] else 'full'}" + ("" if model == "dense" else f":{model}")


def earlier_runs(repeated: set[str], path: Path = RESULTS_DIR / "demo_times.json") -> list[dict[str, Any]]:
    """The recorded runs (`benchmarks/results/demo_times.json`) whose key is not in `repeated`."""
    if not path.exists():
        return []
    return [r for r in json.loads(path.read_text())["raw"] if key(r) not in repeated]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=list(DEFAULT), help="task:full|quick, e.g. vision:quick")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument(
        "--merge", action="store_true", help="keep the recorded runs this call does not repeat"
    )
    args = parser.parse_args()
    runs = []
    for item in args.only:
        task, size, model = (item.split(":") + ["dense"])[:3]
        run = run_one(task, size == "quick", args.seed, args.timeout_s, model)
        print(
            f"{item}: {run['seconds']:.0f} s; "
            + ", ".join(f"{r['name']} {r['accuracy']}%" for r in run["rows"])
        )
        runs.append(run)
    if args.merge:
        runs = earlier_runs({key(r) for r in runs}) + runs
    summary = {key(r): round(r["seconds"]) for r in runs}
    path = write_result("demo_times", {"only": args.only, "seed": args.seed}, runs, summary)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
