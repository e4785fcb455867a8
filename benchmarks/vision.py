"""The built-in visual task over seeds: does GRPO make a tiny VLM count better than its SFT start, and better
than more SFT for the same time? (docs/vision.md)

    .venv/bin/python benchmarks/vision.py --seeds 0,1,2      # the table, results/vision_shapes.json, the plot
    .venv/bin/python benchmarks/vision.py --seeds 0 --smoke  # the pipeline in a few minutes (no real margins)

Per seed, in a temporary folder:

1. data: the shapes task (`quartet.tasks.shapes`: "How many circles are in the image?") as a small fixed
   chat set of worked answers (`--sft-size`, the scarce demonstrations) and an RL prompt set of fresh
   pictures, with `--val-size` held-out pictures in neither;
2. model: a tiny Qwen2-VL built by the code (`quartet.models.tiny_vision`), vision tower trained too;
3. SFT start: `--sft-steps` supervised steps on the chat set (`vision_sft.py`, transformers alone: quartet's
   SFT trainer reads text conversations only);
4. GRPO from the SFT start: `examples/vision/grpo.yaml` through `RLTrainer`, as `quartet train` runs it;
5. control: the same SFT loop continued from the SFT start for GRPO's training seconds (time-matched);
6. all three answer the held-out pictures greedily, scored by the task's rule.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentic import difference_se
from common import write_result

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vision" / "grpo.yaml"
IMAGES = ROOT / "docs" / "images"
START, GRPO, CONTROL = "SFT start", "GRPO", "more SFT (control)"
MODELS = (START, GRPO, CONTROL)


@dataclass(frozen=True)
class VisionSettings:
    """What one seed runs; `SMOKE` is the few-minute version."""

    sft_size: int = 256
    """Worked answers in the fixed chat set (the scarce demonstrations)."""
    rl_size: int = 4096
    """Fresh pictures GRPO may draw from."""
    val_size: int = 200
    """Held-out pictures every model is scored on."""
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 1e-3
    max_distractors: int = 3
    """Squares and triangles among the circles (0: count the coloured cells, the easy version)."""
    overrides: tuple[str, ...] = ()
    """Extra `key=value` overrides of the GRPO config."""


SMOKE = VisionSettings(
    sft_size=64,
    rl_size=256,
    val_size=32,
    sft_steps=10,
    sft_batch=16,
    overrides=(
        "cluster.backend=local",
        "trainer.total_steps=3",
        "trainer.test_freq=0",
        "data.val_batch_size=32",
    ),
)


def prepare_data(folder: Path, seed: int, s: VisionSettings) -> dict[str, Path]:
    """The chat set and the RL set of `seed`, with the SAME held-out pictures (both splits drawn with the
    same seed and validation size); their files."""
    from quartet.tasks.shapes import ShapesSpec, write_rl_set, write_sft_set

    spec = ShapesSpec(max_distractors=s.max_distractors)
    sft_train, sft_val = write_sft_set(folder / "sft", spec, s.sft_size, s.val_size, seed)
    rl_train, rl_val = write_rl_set(folder / "rl", spec, s.rl_size, s.val_size, seed)
    return {"sft_train": sft_train, "sft_val": sft_val, "rl_train": rl_train, "rl_val": rl_val}


def build_model(folder: Path, seed: int) -> Path:
    """The GRPO config's tiny Qwen2-VL shape, built with `seed` and saved in `folder`."""
    from quartet.config import load_config
    from quartet.models import tiny_vision  # the vision kit (issue 40's core)

    tiny = load_config(str(EXAMPLE), [f"model.tiny.seed={seed}"]).model.tiny
    return Path(tiny_vision.save_tiny_vlm(folder, tiny))


def run_grpo(
    start: Path, files: dict[str, Path], seed: int, out: Path, s: VisionSettings
) -> tuple[Path, float]:
    """GRPO from the SFT start on the RL set (validation: the held-out pictures); (exported model, training
    seconds)."""
    from quartet.config import load_config
    from quartet.trainer import RLTrainer

    seeds = [f"{k}={seed}" for k in ("trainer.seed", "data.seed", "rollout.seed")]
    overrides = [
        f"model.path={start}",
        f"data.train_files=[{files['rl_train']}]",
        f"data.val_files=[{files['rl_val']}]",
        f"trainer.output_dir={out}",
        "trainer.loggers=[jsonl]",
        *seeds,
        *s.overrides,
    ]
    result = RLTrainer(load_config(str(EXAMPLE), overrides)).run()
    if result.hf_dir is None:
        raise RuntimeError("the GRPO run exported no model: keep trainer.export_final on")
    return Path(result.hf_dir), float(result.train_seconds)


def _rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return list(pq.read_table(path).to_pylist())


def run_seed(seed: int, out: Path, s: VisionSettings) -> dict[str, Any]:
    """One seed: SFT start, GRPO, time-matched control, each scored on the held-out pictures."""
    from vision_sft import VisionChat, accuracy, sft

    began = time.perf_counter()
    files = prepare_data(out / "data", seed, s)
    sft_rows, val_rows = _rows(files["sft_train"]), _rows(files["rl_val"])
    chat = VisionChat.load(build_model(out / "random", seed))
    start_s, start_steps = sft(
        chat, sft_rows, steps=s.sft_steps, batch_size=s.sft_batch, lr=s.sft_lr, seed=seed
    )
    start = chat.save(out / "sft_start")
    grpo_dir, grpo_s = run_grpo(start, files, seed, out / "grpo", s)
    control = VisionChat.load(start)
    control_s, control_steps = sft(
        control, sft_rows, seconds=grpo_s, batch_size=s.sft_batch, lr=s.sft_lr, seed=seed + 1
    )
    rows = {}
    for name, model, train_s in ((START, chat, start_s), (GRPO, VisionChat.load(grpo_dir), grpo_s)):
        correct, total = accuracy(model, val_rows)
        rows[name] = {"accuracy": correct / total, "correct": correct, "total": total, "train_s": train_s}
    correct, total = accuracy(control, val_rows)
    rows[CONTROL] = {"accuracy": correct / total, "correct": correct, "total": total, "train_s": control_s}
    return verdict(seed, rows) | {
        "sft_steps": {"start": start_steps, "control": control_steps},
        "wall_s": time.perf_counter() - began,
    }


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
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT start steps (default 300)")
    parser.add_argument("--sft-lr", type=float, default=None, help="SFT learning rate (default 1e-3)")
    parser.add_argument("--sft-size", type=int, default=None, help="worked answers in the chat set (256)")
    parser.add_argument("--max-distractors", type=int, default=None, help="0: no squares or triangles (3)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="GRPO config")
    parser.add_argument("--name", default="vision_shapes", help="the result file's and the plot's name")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="result folder (default benchmarks/results)"
    )
    parser.add_argument("--plot-dir", type=Path, default=IMAGES, help="where the plot goes (docs/images)")
    args = parser.parse_args()
    s = SMOKE if args.smoke else VisionSettings()
    s = dataclasses.replace(s, overrides=(*s.overrides, *args.override))
    given = {"sft_steps": args.sft_steps, "sft_lr": args.sft_lr, "sft_size": args.sft_size}
    given["max_distractors"] = args.max_distractors
    s = dataclasses.replace(s, **{k: v for k, v in given.items() if v is not None})
    results = []
    for seed in map(int, args.seeds.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            results.append(run_seed(seed, Path(tmp), s))
        print(json.dumps(results[-1]), flush=True)
    print(markdown_table(results))
    plot = plot_seeds(results, args.plot_dir / f"{args.name}.png")
    settings = {"seeds": args.seeds, "smoke": args.smoke, **dataclasses.asdict(s), "plot": str(plot)}
    path = write_result(args.name, settings, {"seeds": results}, summarise(results), args.out_dir)
    print(f"wrote {path} and {plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
