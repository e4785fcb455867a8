"""The agentic tasks over seeds: does multi-turn RL learn, does it beat more SFT? (docs/agentic.md)

    .venv/bin/python benchmarks/agentic.py --task calculator --seeds 0,1,2   # quartet demo --task calculator
    .venv/bin/python benchmarks/agentic.py --task python --seeds 0,1,2       # examples/agent_python
    .venv/bin/python benchmarks/agentic.py --task user --seeds 0,1,2         # examples/agent_user
    ... --override reward.function=quartet.rewards.partial_credit:digit_partial_credit --name calc_partial

`calculator` runs the demo per seed (SFT start, GRPO from it, the time-matched more-SFT control, all scored by
greedy conversations on the same held-out problems) and reports, per seed, GRPO minus control and the
standard error of that difference (two binomial proportions over the held-out set: sqrt(p1 q1 / n + p2 q2 /
n)); GRPO "wins" a seed when the difference exceeds twice it. `python` and `user` run `quartet train` on the
example's config per seed (its SFT warm start, then GRPO) and report the held-out success before training
(the warm start), after, and the curve at every validation. Wall times are the whole process's.

Writes `benchmarks/results/<name>.json` (default name: agentic_<task>) and prints the table in the form
docs/agentic.md shows.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import table, write_result

ROOT = Path(__file__).resolve().parents[1]
QUARTET = Path(sys.executable).parent / "quartet"
EXAMPLES = {"python": "examples/agent_python/config.yaml", "user": "examples/agent_user/config.yaml"}


def difference_se(p1: float, p2: float, n: int) -> float:
    """Standard error of p1 - p2 for two proportions measured on n items each."""
    return math.sqrt(max(p1 * (1 - p1), 0.0) / n + max(p2 * (1 - p2), 0.0) / n)


def demo_seed(seed: int, overrides: list[str], out_dir: Path, filtered: bool = False) -> dict[str, Any]:
    """One seed of the calculator demo: its rows (three, or four with the verified-SFT control) and wall
    time; GRPO against each control."""
    from quartet.demo import FILTERED_ROW, run_demo

    start = time.perf_counter()
    result = run_demo(
        [f"trainer.output_dir={out_dir}", *overrides], seed=seed, task="calculator", filtered_control=filtered
    )
    wall = time.perf_counter() - start
    rows = {
        r.name: {"accuracy": r.accuracy, "total": r.total, "train_s": r.train_seconds} for r in result.rows
    }
    grpo = rows["GRPO"]

    def versus(control: dict[str, Any]) -> tuple[float, float]:
        diff = grpo["accuracy"] - control["accuracy"]
        return diff, difference_se(grpo["accuracy"], control["accuracy"], grpo["total"])

    diff, se = versus(rows["more SFT (control)"])
    run = {"seed": seed, "rows": rows, "grpo_minus_control": diff, "difference_se": se, "wins": diff > 2 * se}
    if filtered:
        diff_f, se_f = versus(rows[FILTERED_ROW])
        run |= {"grpo_minus_verified": diff_f, "verified_se": se_f, "wins_verified": diff_f > 2 * se_f}
    return run | {"wall_s": wall}


def example_seed(task: str, seed: int, overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """One seed of an example config: held-out success at every validation, and wall time."""
    seeds = [
        f"{k}={seed}" for k in ("trainer.seed", "data.seed", "sft.seed", "model.tiny.seed", "rollout.seed")
    ]
    argv = [str(QUARTET), "train", str(ROOT / EXAMPLES[task]), *seeds, f"trainer.output_dir={out_dir}"]
    argv += ["trainer.loggers=[jsonl]", *overrides]
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (metrics,) = [p for p in out_dir.rglob("metrics.jsonl") if not p.parent.name.endswith("-sft_start")]
    curve, train = [], []
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        if record.get("kind") == "val":
            value = next(v for k, v in record.items() if k.startswith("val-core/") and "/reward/mean@" in k)
            curve.append({"step": int(record["step"]), "success": float(value)})
        elif record.get("kind") == "step" and "agent/success/mean" in record:
            train.append({"step": int(record["step"]), "success": float(record["agent/success/mean"])})
    if not curve:
        raise RuntimeError(f"no validation record in {metrics}")
    return {
        "seed": seed,
        "curve": curve,
        "train_success": train,
        "start": curve[0]["success"],
        "final": curve[-1]["success"],
        "wall_s": wall,
    }


def keep_plot(out_dir: Path, png: Path) -> str | None:
    """`quartet plot` of the GRPO run under `out_dir` (the SFT runs aside), saved to `png` before the
    temporary folder goes; its path, or None when matplotlib is missing."""
    (metrics,) = [p for p in out_dir.rglob("metrics.jsonl") if "sft" not in p.parent.name]
    png.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [str(QUARTET), "plot", str(metrics.parent), "--out", str(png)], capture_output=True, text=True
    )
    return str(png) if proc.returncode == 0 and png.exists() else None


def summarise(task: str, seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds (and the per-seed verdicts)."""
    wall = statistics.fmean(s["wall_s"] for s in seeds)
    if task == "calculator":
        names = list(seeds[0]["rows"])
        return {
            "accuracy_mean": {n: statistics.fmean(s["rows"][n]["accuracy"] for s in seeds) for n in names},
            "grpo_minus_control": [s["grpo_minus_control"] for s in seeds],
            "difference_se": [s["difference_se"] for s in seeds],
            "wins": sum(bool(s["wins"]) for s in seeds),
            "wins_verified": sum(bool(s.get("wins_verified")) for s in seeds),
            "seeds": len(seeds),
            "wall_s_mean": wall,
        }
    return {
        "start_mean": statistics.fmean(s["start"] for s in seeds),
        "final_mean": statistics.fmean(s["final"] for s in seeds),
        "improved": sum(s["final"] > s["start"] for s in seeds),
        "seeds": len(seeds),
        "wall_s_mean": wall,
    }


def print_table(task: str, seeds: list[dict[str, Any]]) -> None:
    if task == "calculator":
        rows = [
            [s["seed"], *(f"{r['accuracy']:.1%}" for r in s["rows"].values()),
             f"{s['grpo_minus_control']:+.1%}", f"{s['difference_se']:.1%}", "yes" if s["wins"] else "no",
             f"{s['wall_s']:.0f}"]
            for s in seeds
        ]  # fmt: skip
        print(table(["seed", *seeds[0]["rows"], "GRPO - control", "SE", "wins", "wall s"], rows))
        if "grpo_minus_verified" in seeds[0]:
            rows = [
                [s["seed"], f"{s['grpo_minus_verified']:+.1%}", f"{s['verified_se']:.1%}",
                 "yes" if s["wins_verified"] else "no"]
                for s in seeds
            ]  # fmt: skip
            print(table(["seed", "GRPO - verified SFT", "SE", "wins"], rows))
        return
    rows = [
        [s["seed"], f"{s['start']:.1%}", f"{s['final']:.1%}",
         " ".join(f"{c['step']}:{c['success']:.0%}" for c in s["curve"]), f"{s['wall_s']:.0f}"]
        for s in seeds
    ]  # fmt: skip
    print(table(["seed", "start", "GRPO", "curve (step:success)", "wall s"], rows))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--task", required=True, choices=["calculator", "python", "user"])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--filtered-control", action="store_true", help="calculator: add the verified-SFT control row"
    )
    parser.add_argument("--name", default=None, help="the result file's name (default agentic_<task>)")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="result folder (default benchmarks/results)"
    )
    args = parser.parse_args()
    results = []
    name = args.name or f"agentic_{args.task}"
    plots = (args.out_dir or ROOT / "benchmarks" / "results") / "plots"
    for seed in map(int, args.seeds.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            run = (
                demo_seed(seed, args.override, Path(tmp), args.filtered_control)
                if args.task == "calculator"
                else example_seed(args.task, seed, args.override, Path(tmp))
            )
            run["plot"] = keep_plot(Path(tmp), plots / f"{name}_seed{seed}.png")
        results.append(run)
        print(json.dumps(run), flush=True)
    print_table(args.task, results)
    settings = {"task": args.task, "seeds": args.seeds, "overrides": args.override}
    settings["filtered_control"] = args.filtered_control
    path = write_result(name, settings, {"seeds": results}, summarise(args.task, results), args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
