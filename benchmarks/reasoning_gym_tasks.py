"""Three reasoning-gym tasks nobody here wrote: SFT start vs GRPO vs the time-matched more-SFT control.

    .venv/bin/python benchmarks/reasoning_gym_tasks.py                       # screen, choose 3, seeds 0-2
    .venv/bin/python benchmarks/reasoning_gym_tasks.py --tasks gcd,chain_sum,count_bits --no-screen

Each (task, seed) runs `quartet demo --task reasoning_gym:<task>` in process (`quartet.demo.run_demo`:
SFT start on a few hundred worked examples, GRPO from it, more SFT from it for GRPO's training time, all
three scored greedily on the same 200 held-out problems, right when reasoning-gym's own score is 1).

Choosing the tasks: the candidates (`--candidates`; `quartet.demo.reasoning_gym.SETTINGS` sizes them so
their questions and answers are short in the tiny tokenizer) run seed 0 first; the three whose SFT start
is nearest 50% held-out accuracy, among those between `--floor` and `1 - --floor`, are kept, and run the
other seeds (a task the SFT start already solves, or cannot start on, shows nothing about RL).

Per (task, seed): GRPO minus control and the standard error of that difference (two binomial proportions
over the held-out set, sqrt(p1 q1 / n + p2 q2 / n)); per task: the mean over seeds and the standard error of
that mean (the spread of the seeds' differences / sqrt(seeds)). Writes `benchmarks/results/<name>.json`
after every run (a stopped run keeps what it finished), the plot `docs/images/<name>.png`, and prints the
table docs/environments.md shows.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import table, write_result

ROOT = Path(__file__).resolve().parents[1]
CANDIDATES = ("basic_arithmetic", "chain_sum", "count_bits", "gcd", "letter_counting")
RESULTS = ROOT / "benchmarks" / "results"
ROWS = ("SFT start", "GRPO", "more SFT (control)")


def difference_se(p1: float, p2: float, n: int) -> float:
    """Standard error of p1 - p2 for two proportions measured on n items each."""
    return math.sqrt(max(p1 * (1 - p1), 0.0) / n + max(p2 * (1 - p2), 0.0) / n)


def run_one(task: str, seed: int, overrides: list[str]) -> dict[str, Any]:
    """One (task, seed) of the demo: its three rows, GRPO minus control with its standard error, wall time."""
    from quartet.demo import run_demo

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_demo(
            [f"trainer.output_dir={tmp}", "trainer.loggers=[jsonl]", *overrides],
            seed=seed,
            task=f"reasoning_gym:{task}",
        )
    rows = {
        r.name: {"accuracy": r.accuracy, "correct": r.correct, "total": r.total, "train_s": r.train_seconds}
        for r in result.rows
    }
    grpo, control = rows["GRPO"], rows["more SFT (control)"]
    diff = grpo["accuracy"] - control["accuracy"]
    se = difference_se(grpo["accuracy"], control["accuracy"], grpo["total"])
    return {
        "task": task,
        "seed": seed,
        "rows": rows,
        "grpo_minus_control": diff,
        "difference_se": se,
        "wins": diff > 2 * se,
        "wall_s": time.perf_counter() - start,
        "majority": majority_baseline(task, seed),
    }


def majority_baseline(task: str, seed: int) -> dict[str, Any]:
    """The held-out accuracy of always answering the training set's most common answer (the demo's data
    for `task` and `seed`, written again here: the same rows): what an SFT start that learned only the
    answer's format and its most frequent value scores."""
    import collections

    import pyarrow.parquet as pq

    from quartet.demo import demo_config
    from quartet.environments.reasoning_gym_files import write_config_sets

    cfg = demo_config([], seed, False, f"reasoning_gym:{task}")
    with tempfile.TemporaryDirectory() as tmp:
        train, val = write_config_sets(cfg.data, Path(tmp))
        answers = [r["reward_model"]["ground_truth"] for r in pq.read_table(train).to_pylist()]
        held_out = [r["reward_model"]["ground_truth"] for r in pq.read_table(val).to_pylist()]
    mode = collections.Counter(answers).most_common(1)[0][0]
    return {"answer": mode, "accuracy": sum(a == mode for a in held_out) / len(held_out)}


def choose(screen: list[dict[str, Any]], count: int, floor: float) -> list[str]:
    """The `count` screened tasks whose SFT start is nearest 50%, those in [floor, 1 - floor] first (when
    fewer fit, the nearest of the others fill the list: the result says so in `raw.screen`)."""
    start = {r["task"]: r["rows"]["SFT start"]["accuracy"] for r in screen}
    return sorted(start, key=lambda t: (not floor <= start[t] <= 1 - floor, abs(start[t] - 0.5)))[:count]


def summarise(runs: list[dict[str, Any]], tasks: list[str]) -> dict[str, Any]:
    """Per chosen task: mean accuracy of each row, GRPO minus control (mean, its standard error over seeds,
    per seed), wins."""
    out: dict[str, Any] = {}
    for task in tasks:
        mine = [r for r in runs if r["task"] == task]
        if not mine:
            continue
        diffs = [r["grpo_minus_control"] for r in mine]
        spread = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
        out[task] = {
            "seeds": [r["seed"] for r in mine],
            "accuracy_mean": {n: statistics.fmean(r["rows"][n]["accuracy"] for r in mine) for n in ROWS},
            "majority_answer_mean": statistics.fmean(r["majority"]["accuracy"] for r in mine),
            "grpo_minus_control_mean": statistics.fmean(diffs),
            "grpo_minus_control_se": spread,
            "grpo_minus_control": diffs,
            "difference_se": [r["difference_se"] for r in mine],
            "wins": sum(bool(r["wins"]) for r in mine),
            "wall_s_mean": statistics.fmean(r["wall_s"] for r in mine),
        }
    return out


def print_table(summary: dict[str, Any]) -> None:
    rows = [
        [task, len(s["seeds"]), f"{s['majority_answer_mean']:.1%}",
         *(f"{s['accuracy_mean'][n]:.1%}" for n in ROWS),
         f"{s['grpo_minus_control_mean']:+.1%} ± {s['grpo_minus_control_se']:.1%}",
         f"{s['wins']}/{len(s['seeds'])}", f"{s['wall_s_mean']:.0f}"]
        for task, s in summary.items()
    ]  # fmt: skip
    print(table(["task", "seeds", "majority", *ROWS, "GRPO - control (± SE)", "wins", "wall s"], rows))


def plot(summary: dict[str, Any], runs: list[dict[str, Any]], png: Path) -> str | None:
    """Bars: each row's mean held-out accuracy per task, the seeds as dots; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.26
    for k, name in enumerate(ROWS):
        xs = [i + (k - 1) * width for i in range(len(summary))]
        ax.bar(xs, [s["accuracy_mean"][name] for s in summary.values()], width, label=name)
        for x, task in zip(xs, summary, strict=True):
            seeds = [r["rows"][name]["accuracy"] for r in runs if r["task"] == task]
            ax.plot([x] * len(seeds), seeds, "k.", markersize=4)
    for i, s in enumerate(summary.values()):
        label = "most common answer" if i == 0 else None
        ax.hlines(s["majority_answer_mean"], i - 1.5 * width, i + 1.5 * width, "k", "dashed", label=label)
    ax.set_xticks(range(len(summary)), list(summary))
    ax.set_ylabel("greedy held-out accuracy")
    ax.set_title("reasoning-gym tasks, tiny Qwen2 on CPU: mean of seeds (dots: each seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return str(png)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--candidates", default=",".join(CANDIDATES))
    parser.add_argument("--tasks", default="", help="the tasks to run (with --no-screen)")
    parser.add_argument("--no-screen", action="store_true", help="run --tasks, no screening")
    parser.add_argument("--count", type=int, default=3)
    parser.add_argument("--floor", type=float, default=0.05)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--name", default="reasoning_gym")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument(
        "--resume", action="store_true", help="keep the runs of the result file already written, run the rest"
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: list[dict[str, Any]] = []
    settings = {k: v for k, v in vars(args).items() if k not in ("out_dir", "resume")}
    if args.resume:
        runs = json.loads(((args.out_dir or RESULTS) / f"{args.name}.json").read_text())["raw"]["runs"]
        for r in runs:  # files written before the baseline was recorded
            r.setdefault("majority", majority_baseline(r["task"], r["seed"]))

    def save(tasks: list[str], screen: list[dict[str, Any]]) -> dict[str, Any]:
        summary = summarise(runs, tasks)
        raw = {"runs": runs, "screen": [(r["task"], r["rows"]["SFT start"]["accuracy"]) for r in screen]}
        write_result(args.name, settings | {"chosen": tasks}, raw, summary, args.out_dir)
        return summary

    screen: list[dict[str, Any]] = []
    if args.no_screen:
        tasks = args.tasks.split(",")
        # a resumed run keeps the screening it did (the candidates' seed-0 runs)
        screen = [r for r in runs if r["seed"] == seeds[0] and r["task"] in args.candidates.split(",")]
    else:
        for task in args.candidates.split(","):
            found = [r for r in runs if (r["task"], r["seed"]) == (task, seeds[0])]
            runs += [] if found else [run_one(task, seeds[0], args.override)]
            screen.append(found[0] if found else runs[-1])
            print(f"screen {task}: SFT start {screen[-1]['rows']['SFT start']['accuracy']:.1%}", flush=True)
            save([], screen)
        tasks = choose(screen, args.count, args.floor)
        print(f"chosen: {tasks}", flush=True)
    done = {(r["task"], r["seed"]) for r in runs}
    for seed in seeds:
        for task in tasks:
            if (task, seed) not in done:
                runs.append(run_one(task, seed, args.override))
                r = runs[-1]
                print(
                    f"{task} seed {seed}: {r['grpo_minus_control']:+.1%} ± {r['difference_se']:.1%}",
                    flush=True,
                )
                save(tasks, screen)
    summary = save(tasks, screen)
    print_table(summary)
    png = plot(
        summary, [r for r in runs if r["task"] in tasks], ROOT / "docs" / "images" / f"{args.name}.png"
    )
    print(f"plot: {png}")


if __name__ == "__main__":
    main()
