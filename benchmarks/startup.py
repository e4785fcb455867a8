"""Time from the command to the end of the first step: quartet (Ray, and the local backend) vs TRL.

The same tiny model folder and prompt files as `grpo_vs_trl.py` (`grpo_runs.prepare`); each run is a fresh
process of one GRPO step, sides alternated, `--repeat` rounds. Measured from outside: the parent's clock at
spawn to the first step's end as the child wrote it (`time.time()`: quartet's step record in metrics.jsonl,
TRL's `first_step_end_unix`), minus the first step's own duration = time to the first step's start. Quartet's
own phases come from its `startup` record (imports, prepare, trackers, reward pool, workers: Ray, pool,
actors and their model loads; first step).

    .venv/bin/python benchmarks/startup.py [--repeat 3] [--no-trl]

Variants: `quartet_ray` (a local Ray started by the run, `cluster.address=local`), `quartet_ray_warm` (a
`ray start --head` cluster already running on this machine, which a run with the default `cluster.address`
joins: the opt-in way to skip Ray's start on every run), `quartet_local` (`cluster.backend=local`, no Ray),
and `trl`.

Results: `benchmarks/results/startup.json` (medians, and every run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from common import write_result  # noqa: E402
from grpo_runs import GrpoSettings, prepare, run_quartet, run_trl  # noqa: E402
from trl_env import ensure_trl_venv  # noqa: E402


def _quartet(work: Any, s: GrpoSettings, out: Path, name: str) -> dict[str, Any]:
    spawn = time.time()
    result = run_quartet(work, s, out, name)
    records = [json.loads(x) for x in (out / "bench" / name / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if r.get("kind") == "step")
    startup = next((r for r in records if r.get("kind") == "startup"), {})
    first_end = float(step["time"]) - spawn
    first = result.step_seconds[0]
    return {
        "side": "quartet",
        "to_first_step_end_s": round(first_end, 3),
        "first_step_s": round(first, 3),
        "to_first_step_s": round(first_end - first, 3),
        "phases": {k: v for k, v in startup.items() if k.endswith("_s")},
    }


def _trl(python: Path, work: Any, s: GrpoSettings, out: Path, name: str) -> dict[str, Any]:
    spawn = time.time()
    run_trl(python, work, s, out, name)
    raw = json.loads((out / f"{name}.json").read_text())
    first_end = float(raw["first_step_end_unix"]) - spawn
    first = float(raw["step_seconds"][0])
    return {
        "side": "trl",
        "to_first_step_end_s": round(first_end, 3),
        "first_step_s": round(first, 3),
        "to_first_step_s": round(first_end - first, 3),
        "phases": {"imports_and_setup_s": round(float(raw["startup_seconds"]), 3)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    s = GrpoSettings(steps=1, prompts_per_step=8, n=4, max_new_tokens=16, threads=args.threads)
    local = dataclasses.replace(s, quartet_overrides=("cluster.backend=local",))
    cold = dataclasses.replace(s, quartet_overrides=("cluster.address=local",))
    trl_python = None if args.no_trl else ensure_trl_venv()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quartet-startup-") as tmp:
        work = prepare(Path(tmp), "tiny")
        for r in range(args.repeat):
            runs.append({"variant": "quartet_ray", **_quartet(work, cold, Path(tmp) / f"q{r}", f"q{r}")})
            runs.append({"variant": "quartet_local", **_quartet(work, local, Path(tmp) / f"l{r}", f"l{r}")})
            if trl_python is not None:
                runs.append({"variant": "trl", **_trl(trl_python, work, s, Path(tmp) / f"t{r}", f"t{r}")})
            print(json.dumps(runs[-3:], indent=1), flush=True)
        ray = Path(sys.executable).parent / "ray"
        subprocess.run(
            [str(ray), "start", "--head", f"--num-cpus={args.threads}"], check=True, capture_output=True
        )
        try:
            for r in range(args.repeat):
                runs.append(
                    {"variant": "quartet_ray_warm", **_quartet(work, s, Path(tmp) / f"w{r}", f"w{r}")}
                )
        finally:
            subprocess.run([str(ray), "stop", "--force"], capture_output=True, timeout=120)
    summary: dict[str, Any] = {}
    for variant in sorted({r["variant"] for r in runs}):
        mine = [r for r in runs if r["variant"] == variant]
        summary[variant] = {
            key: round(statistics.median(r[key] for r in mine), 3)
            for key in ("to_first_step_s", "first_step_s", "to_first_step_end_s")
        }
        phases = sorted({k for r in mine for k in r["phases"]})
        summary[variant]["phases_median"] = {
            k: round(statistics.median(r["phases"].get(k, 0.0) for r in mine), 3) for k in phases
        }
    if "trl" in summary:
        for variant in ("quartet_ray", "quartet_ray_warm", "quartet_local"):
            summary[variant]["vs_trl"] = round(
                summary[variant]["to_first_step_s"] / summary["trl"]["to_first_step_s"], 2
            )
    path = write_result(
        "startup", dataclasses.asdict(s) | {"repeat": args.repeat}, runs, summary, args.out_dir
    )
    print(json.dumps(summary, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
