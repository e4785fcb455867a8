"""The built-in visual task over seeds: does GRPO make a tiny VLM count better than its SFT start, and better
than more SFT for the same time? (docs/vision.md)

    .venv/bin/python benchmarks/vision.py --seeds 0,1,2      # the table, results/vision_shapes.json, the plot
    .venv/bin/python benchmarks/vision.py --seeds 0 --smoke  # the pipeline in a few minutes (no real margins)

Each seed is exactly `quartet demo --task vision --seed N` (`quartet.demo.vision.run_vision`: the embedded
`vision.yaml` for GRPO, `VisionSettings` for the SFT start and the control), in a temporary folder:

1. data: the shapes task (`quartet.tasks.shapes`: "How many circles are in the image?") as a small fixed
   chat set of worked answers (the scarce demonstrations) and an RL prompt set of fresh pictures, with
   held-out pictures in neither;
2. model: a tiny Qwen2-VL built by the code (`quartet.models.tiny_vision`), vision tower trained too;
3. SFT start: supervised steps on the chat set (`quartet.demo.vision_sft`, transformers alone: quartet's
   SFT trainer reads text conversations only);
4. GRPO from the SFT start through `RLTrainer`, as `quartet train` runs it;
5. control: the same SFT loop continued from the SFT start for GRPO's training seconds (time-matched);
6. all three answer the held-out pictures greedily, scored by the task's rule.

`--smoke` is the demo's `--quick`. The flags `--sft-steps`, `--sft-lr`, `--sft-size`, `--max-distractors`
change `VisionSettings`; `--override KEY=VALUE` changes the GRPO config (after the seed and `--smoke`).

Per seed it reports the three accuracies, GRPO minus control and the standard error of that difference
(`agentic.difference_se`); GRPO "wins" a seed when the difference exceeds twice it. Writes
`benchmarks/results/<name>.json`, prints the markdown table docs/vision.md shows, and draws
`docs/images/<name>.png` (accuracy per seed and model, with binomial error bars).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentic import difference_se
from common import write_result

from quartet.demo.vision import CONTROL_ROW as CONTROL
from quartet.demo.vision import GRPO_ROW as GRPO
from quartet.demo.vision import QUICK_SETTINGS, SETTINGS, VisionSettings
from quartet.demo.vision import ROWS as MODELS
from quartet.demo.vision import START_ROW as START

ROOT = Path(__file__).resolve().parents[1]
IMAGES = ROOT / "docs" / "images"


def _progress(rec: dict[str, Any]) -> None:
    """The SFT loop's and GRPO's progress on stderr (the table goes to stdout)."""
    if rec["kind"] == "train":
        print(f"  sft step {rec['step']}: loss {rec['loss']:.4f} {rec['train_s']:.0f} s", file=sys.stderr)
    elif rec["kind"] == "step" and rec["step"] % 10 == 0:
        print(f"  grpo step {rec['step']}", file=sys.stderr, flush=True)


def run_seed(
    seed: int, out: Path, s: VisionSettings, overrides: list[str], smoke: bool = False
) -> dict[str, Any]:
    """One seed of the demo's experiment in `out`: SFT start, GRPO, time-matched control, each scored on
    the held-out pictures."""
    from quartet.demo import demo_config
    from quartet.demo.vision import run_vision

    began = time.perf_counter()
    base = [f"trainer.output_dir={out}", "trainer.loggers=[jsonl]"]
    cfg = demo_config([*base, *overrides], seed, smoke, "vision")
    models, _ = run_vision(cfg, s, f"seed{seed}", _progress)
    rows = {
        m.name: {
            "accuracy": m.correct / m.total,
            "correct": m.correct,
            "total": m.total,
            "train_s": m.train_seconds,
        }
        for m in models
    }
    steps = {"start": models[0].steps, "control": models[2].steps}
    return verdict(seed, rows) | {"sft_steps": steps, "wall_s": time.perf_counter() - began}


def verdict(seed: int, rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A seed's rows with GRPO against the control and the start: differences, their standard errors, and
    whether GRPO beats the control by more than two of them."""
    grpo, control, start = (rows[name] for name in (GRPO, CONTROL, START))
    diff = grpo["accuracy"] - control["accuracy"]
    se = difference_se(grpo["accuracy"], control["accuracy"], grpo["total"])
    gain = grpo["accuracy"] - start["accuracy"]
    gain_se = difference_se(grpo["accuracy"], start["accuracy"], grpo["total"])
    return {
        "seed": seed,
        "rows": rows,
        "grpo_minus_control": diff,
        "difference_se": se,
        "wins": diff > 2 * se,
        "grpo_minus_start": gain,
        "start_se": gain_se,
        "improves": gain > 2 * gain_se,
    }


def summarise(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over seeds, and how many seeds GRPO won against the control and improved on the start."""
    return {
        "accuracy_mean": {n: statistics.fmean(s["rows"][n]["accuracy"] for s in seeds) for n in MODELS},
        "grpo_minus_control": [s["grpo_minus_control"] for s in seeds],
        "difference_se": [s["difference_se"] for s in seeds],
        "wins": sum(bool(s["wins"]) for s in seeds),
        "improves": sum(bool(s["improves"]) for s in seeds),
        "seeds": len(seeds),
        "wall_s_mean": statistics.fmean(s["wall_s"] for s in seeds),
    }


def markdown_table(seeds: list[dict[str, Any]]) -> str:
    """The per-seed table of docs/vision.md."""
    head = ["seed", *MODELS, "GRPO - control", "SE", "wins", "GRPO train s", "wall s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in seeds:
        cells = [str(s["seed"]), *(f"{s['rows'][n]['accuracy']:.1%}" for n in MODELS)]
        cells += [
            f"{s['grpo_minus_control']:+.1%}",
            f"{s['difference_se']:.1%}",
            "yes" if s["wins"] else "no",
        ]
        cells += [f"{s['rows'][GRPO]['train_s']:.0f}", f"{s['wall_s']:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_seeds(seeds: list[dict[str, Any]], png: Path) -> Path:
    """Grouped bars: each model's held-out accuracy per seed, with its binomial standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quartet.tasks.shapes import ShapesSpec

    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.8 / len(MODELS)
    for k, name in enumerate(MODELS):
        accs = [s["rows"][name]["accuracy"] for s in seeds]
        errs = [math.sqrt(a * (1 - a) / s["rows"][name]["total"]) for a, s in zip(accs, seeds, strict=True)]
        xs = [i + (k - (len(MODELS) - 1) / 2) * width for i in range(len(seeds))]
        ax.bar(xs, accs, width, yerr=errs, capsize=3, label=name)
    spec = ShapesSpec()
    chance = 1 / (spec.max_count - spec.min_count + 1)
    ax.axhline(chance, ls="--", lw=0.8, color="grey", label=f"always one count ({chance:.0%})")
    ax.set_xticks(range(len(seeds)), [f"seed {s['seed']}" for s in seeds])
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.set_title("shapes: how many circles? tiny Qwen2-VL")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes: checks the pipeline, not the margins"
    )
    parser.add_argument("--sft-steps", type=int, default=None, help=f"SFT start steps ({SETTINGS.sft_steps})")
    parser.add_argument("--sft-lr", type=float, default=None, help=f"SFT learning rate ({SETTINGS.sft_lr})")
    parser.add_argument("--sft-size", type=int, default=None, help=f"chat-set size ({SETTINGS.sft_size})")
    parser.add_argument("--max-distractors", type=int, default=None, help="0: no squares or triangles")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="GRPO config")
    parser.add_argument("--name", default="vision_shapes", help="the result file's and the plot's name")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="result folder (default benchmarks/results)"
    )
    parser.add_argument("--plot-dir", type=Path, default=IMAGES, help="where the plot goes (docs/images)")
    args = parser.parse_args()
    from quartet.cli.console import quiet_transformers

    quiet_transformers()  # no weight-loading bars between the progress lines
    s = QUICK_SETTINGS if args.smoke else SETTINGS
    given = {"sft_steps": args.sft_steps, "sft_lr": args.sft_lr, "sft_size": args.sft_size}
    given["max_distractors"] = args.max_distractors
    s = dataclasses.replace(s, **{k: v for k, v in given.items() if v is not None})
    results = []
    for seed in map(int, args.seeds.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run_seed(seed, Path(tmp), s, args.override, args.smoke))
        print(json.dumps(results[-1]), flush=True)
    print(markdown_table(results))
    plot = plot_seeds(results, args.plot_dir / f"{args.name}.png")
    settings = {"seeds": args.seeds, "smoke": args.smoke, **dataclasses.asdict(s), "overrides": args.override}
    settings["plot"] = str(plot)
    path = write_result(args.name, settings, {"seeds": results}, summarise(results), args.out_dir)
    print(f"wrote {path} and {plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
