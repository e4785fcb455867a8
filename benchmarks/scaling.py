"""Scaling of quartet's GRPO step: step time as prompts per step grow, and as the response length grows.

    .venv/bin/python benchmarks/scaling.py                    # prompts 8..64 at 32 tokens; 64..256 tokens
    .venv/bin/python benchmarks/scaling.py --size 20M --prompts 8,16 --lengths 64
    .venv/bin/python benchmarks/scaling.py --smoke

Each point is one `quartet train` process (n = 4 samples per prompt, random weights, fp32, one thread),
`--steps` steps of which the first (warm-up) is dropped; the median of the rest is the point's step time,
split by phase. Random weights do sample end-of-text now and then (1 in 512 tokens), so the generated
tokens per step are measured, and the cost is also given per 1k generated tokens.

Near-linear means: step time = fixed + slope x size. The fit is least squares over the points; a point's
deviation is how far its time lies from the line (relative). Where the marginal cost between consecutive
points (seconds per added prompt, or per added token) rises or falls by more than 30% from the previous
interval, the table marks a knee; the phases of the two points tell where it comes from.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from common import table, write_result
from grpo_runs import SMOKE_OVERRIDES, GrpoSettings, prepare, run_quartet

KNEE = 0.30


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - slope * mx, slope


def analyse(xs: list[float], ys: list[float]) -> dict[str, Any]:
    """The fit, each point's relative deviation from it, the marginal costs and the knees among them."""
    intercept, slope = linear_fit(xs, ys)
    deviation = [(y - (intercept + slope * x)) / y for x, y in zip(xs, ys, strict=True)]
    marginal = [(ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i]) for i in range(len(xs) - 1)]
    knees = [
        {
            "between": [xs[i], xs[i + 1], xs[i + 2]],
            "marginal_before": marginal[i],
            "marginal_after": marginal[i + 1],
        }
        for i in range(len(marginal) - 1)
        if marginal[i] > 0 and abs(marginal[i + 1] / marginal[i] - 1) > KNEE
    ]
    return {
        "intercept_s": intercept,
        "slope_s": slope,
        "max_abs_deviation": max(abs(d) for d in deviation),
        "deviation": deviation,
        "marginal_s": marginal,
        "knees": knees,
    }


def point(w: Any, s: GrpoSettings, workdir: Path, name: str, done: dict[GrpoSettings, Any]) -> dict[str, Any]:
    """One point's figures; a point both sweeps share (the same settings) runs once (`done`)."""
    if s not in done:
        done[s] = run_quartet(w, s, workdir / "runs" / name, name)
    run = done[s]
    rows = s.prompts_per_step * s.n
    generated = [rows * length for length in run.response_length_mean[1:]]
    step = statistics.median(run.step_seconds[1:])
    phases = {k: statistics.median(v[1:]) for k, v in run.phase_seconds.items()}
    print(f"  {name}: step {step:.3f} s, " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()), flush=True)
    return {
        "prompts": s.prompts_per_step,
        "max_new_tokens": s.max_new_tokens,
        "step_s": step,
        "phases_s": phases,
        "generated_tokens": statistics.fmean(generated),
        "s_per_1k_generated": 1000 * step / statistics.fmean(generated),
        "step_seconds": run.step_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="tiny", choices=["tiny", "demo", "20M"])
    parser.add_argument("--prompts", default="8,16,32,64")
    parser.add_argument("--lengths", default="64,128,256")
    parser.add_argument("--base-prompts", type=int, default=16, help="prompts per step of the length sweep")
    parser.add_argument("--base-length", type=int, default=32, help="max new tokens of the prompts sweep")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="two points per sweep, small")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.lengths, args.base_prompts, args.base_length, args.n, args.steps = (
            "2,4",
            "8,16",
            2,
            8,
            2,
            3,
        )
    torch.set_num_threads(args.threads)
    base = GrpoSettings(
        steps=args.steps,
        n=args.n,
        threads=args.threads,
        max_prompt_length=32,
        quartet_overrides=SMOKE_OVERRIDES if args.smoke else (),
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        w = prepare(workdir, args.size)
        done: dict[GrpoSettings, Any] = {}
        by_prompts = [
            point(
                w,
                replace(base, prompts_per_step=p, max_new_tokens=args.base_length),
                workdir,
                f"prompts{p}",
                done,
            )
            for p in map(int, args.prompts.split(","))
        ]
        by_length = [
            point(
                w,
                replace(base, prompts_per_step=args.base_prompts, max_new_tokens=n),
                workdir,
                f"length{n}",
                done,
            )
            for n in map(int, args.lengths.split(","))
        ]
    fit_p = analyse([float(p["prompts"]) for p in by_prompts], [p["step_s"] for p in by_prompts])
    fit_l = analyse([float(p["max_new_tokens"]) for p in by_length], [p["step_s"] for p in by_length])
    for title, points, fit, key in (
        ("prompts per step", by_prompts, fit_p, "prompts"),
        ("max new tokens", by_length, fit_l, "max_new_tokens"),
    ):
        rows = [
            [p[key], p["step_s"], p["generated_tokens"], p["s_per_1k_generated"],
             p["phases_s"].get("gen", 0.0), p["phases_s"].get("update_actor", 0.0), d]
            for p, d in zip(points, fit["deviation"], strict=True)
        ]  # fmt: skip
        print(f"\n{title}: step = {fit['intercept_s']:.3f} s + {fit['slope_s']:.4f} s x {key}")
        print(table([key, "step s", "gen tokens", "s/1k tok", "gen s", "update s", "off line"], rows))
        for knee in fit["knees"]:
            before, after = knee["marginal_before"], knee["marginal_after"]
            print(f"  knee at {knee['between'][1]}: marginal {before:.4f} -> {after:.4f} s per unit")
    settings = vars(base) | {"size": args.size, "prompts": args.prompts, "lengths": args.lengths,
                             "base_prompts": args.base_prompts, "base_length": args.base_length}  # fmt: skip
    summary = {
        "params": w.params,
        "prompts": {"points": [{k: v for k, v in p.items() if k != "step_seconds"} for p in by_prompts]}
        | fit_p,
        "lengths": {"points": [{k: v for k, v in p.items() if k != "step_seconds"} for p in by_length]}
        | fit_l,
    }
    raw = {"prompts": by_prompts, "lengths": by_length}
    print(f"wrote {write_result('scaling', settings, raw, summary, args.out_dir)}")


if __name__ == "__main__":
    main()
