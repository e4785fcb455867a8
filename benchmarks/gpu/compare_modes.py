"""Sync against async on ONE GPU, from the metrics of two `quartet train` runs (issue 37, part 5).

    quartet train examples/single_gpu/sync.yaml  trainer.total_steps=8 trainer.output_dir=$OUT/runs
    quartet train examples/single_gpu/async.yaml trainer.total_steps=8 trainer.output_dir=$OUT/runs
    python benchmarks/gpu/compare_modes.py $OUT/runs/quartet/single-gpu-sync \\
        $OUT/runs/quartet/single-gpu-async --skip 2 --out $OUT/one_gpu_modes.json

Per run: the median step time over the steps after the first `--skip` (the first steps fill the async
pipeline and warm the CUDA graphs and the allocator), samples per second at that median (prompts per step
x samples per prompt, read from the run's config), the mean `perf/overlap` (share of a step both pools
were busy) and `async/staleness_mean`; then each run's speed-up over the first one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

__all__ = ["compare", "summarize"]


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _samples_per_step(run_dir: Path) -> int:
    """train_batch_size x rollout.n of the run, from the config it saved."""
    from quartet.config import load_config

    cfg = load_config(run_dir / "config.yaml", check=False)
    return cfg.data.train_batch_size * cfg.rollout.n


def summarize(run_dir: Path, skip: int) -> dict[str, Any]:
    """The figures of one run (module docstring)."""
    steps = [r for r in _records(run_dir) if r.get("kind") == "step"]
    timed = steps[skip:] or steps
    if not timed:
        raise ValueError(f"{run_dir}/metrics.jsonl has no step record: did the run train?")
    median = statistics.median(float(r["timing_s/step"]) for r in timed)
    out: dict[str, Any] = {
        "run": str(run_dir),
        "steps": len(steps),
        "timed_steps": len(timed),
        "step_s_median": round(median, 4),
        "samples_per_s": round(_samples_per_step(run_dir) / median, 2),
    }
    for key in ("perf/overlap", "async/staleness_mean", "timing_s/gen", "timing_s/update_actor"):
        values = [float(r[key]) for r in timed if key in r]
        if values:
            out[key] = round(statistics.fmean(values), 4)
    return out


def compare(run_dirs: list[Path], skip: int) -> dict[str, Any]:
    """Every run's figures and its samples/s over the first run's."""
    runs = [summarize(d, skip) for d in run_dirs]
    base = runs[0]["samples_per_s"]
    for run in runs:
        run["x_first"] = round(run["samples_per_s"] / base, 3)
    return {"skip": skip, "runs": runs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders; the first is the baseline")
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the medians")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args(argv)
    result = compare(args.runs, args.skip)
    text = json.dumps(result, indent=2)
    if args.out is not None:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
