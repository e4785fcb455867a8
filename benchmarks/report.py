"""One page of the headline figures of the last `make bench` (the JSON files in `benchmarks/results/`).

    .venv/bin/python benchmarks/report.py [--dir benchmarks/results]

Each line names the file it comes from; a benchmark that has not been run is said to be missing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from common import RESULTS_DIR


def load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def grpo_lines(r: dict[str, Any]) -> list[str]:
    out = []
    for size, s in r["summary"].items():
        phases = ", ".join(f"{k} {v:.3f}" for k, v in s["quartet_phases_median_s"].items())
        out.append(
            f"  {size} ({s['params'] / 1e6:.2f}M): TRL {s['trl_step_s']['median']:.3f} s, quartet "
            f"{s['quartet_step_s']['median']:.3f} s per step -> TRL/quartet {s['trl_over_quartet']:.2f}x; "
            f"floor {s['floor']['total_s']:.3f} s: quartet at {s['quartet_over_floor']:.2f}x the floor, "
            f"TRL at {s['trl_over_floor']:.2f}x\n    quartet phases (median s): {phases}"
        )
    return out


def tta_lines(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    out = [f"  warm start {s['warm_start_accuracy']:.1%}, threshold {s['threshold']:.1%}"]
    for side in ("trl", "quartet"):
        t = s[side]
        out.append(
            f"  {side}: reached {t['reached']}, steps {t['steps_to_threshold']}, "
            f"train s to threshold (median) {t['train_seconds_to_threshold']['median']:.1f}, "
            f"step {t['step_s']['median']:.3f} s"
        )
    ratio = s.get("trl_over_quartet")
    out.append(f"  TRL/quartet time to accuracy: {ratio:.2f}x" if ratio else "  TRL/quartet: one side missed")
    return out


def rollout_lines(r: dict[str, Any]) -> list[str]:
    out = []
    for dtype, f in r["summary"]["by_dtype"].items():
        vllm = f.get("vllm_tok_s")
        out.append(
            f"  {dtype}: engine {f['engine_tok_s']:.0f} tok/s, generate {f['generate_tok_s']:.0f} "
            f"(engine/generate {f['engine_over_generate']:.2f}x)"
            + (f", vLLM {vllm:.0f} (vLLM/engine {f['vllm_over_engine']:.2f}x)" if vllm else ", vLLM not run")
            + f"; engine at {f['engine_fraction_of_compute_bound']:.0%} of its compute bound"
        )
        if f.get("suspect"):
            out.append(f"  WARNING {dtype}: {f['suspect']}")
    return out


def train_lines(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    peaks = s["matmul_peak_gflops"]
    out = [f"  matmul peak: fp32 {peaks['float32']:.0f}, bf16 {peaks['bfloat16']:.0f} GFLOP/s"]
    for size, entry in s["sizes"].items():
        for dtype in ("float32", "bfloat16"):
            f = entry[dtype]
            out.append(
                f"  {size} {dtype}: {f['train_tok_s']:.0f} train tok/s, {f['gflops']:.0f} GFLOP/s = "
                f"{f['mfu_bf16']:.0%} of the bf16 peak, {f['mfu_fp32']:.0%} of the fp32 peak"
            )
        out += [f"  WARNING {size}: {warning}" for warning in entry.get("suspect", [])]
    return out


def scaling_lines(r: dict[str, Any]) -> list[str]:
    out = []
    for sweep, key in (("prompts", "prompts"), ("lengths", "max_new_tokens")):
        s = r["summary"][sweep]
        points = ", ".join(f"{p[key]}: {p['step_s']:.3f}" for p in s["points"])
        knees = ", ".join(str(k["between"][1]) for k in s["knees"]) or "none"
        out.append(
            f"  by {key}: {points} s; fit {s['intercept_s']:.3f} + {s['slope_s']:.4f} x; "
            f"max off line {s['max_abs_deviation']:.0%}; knees: {knees}"
        )
    return out


SECTIONS = [
    ("grpo_vs_trl", "GRPO step, quartet vs TRL", grpo_lines),
    ("time_to_accuracy", "Time to accuracy (demo task)", tta_lines),
    ("rollout_throughput", "Rollout tokens/s", rollout_lines),
    ("train_throughput", "Actor update throughput and MFU", train_lines),
    ("scaling", "Scaling of quartet's step", scaling_lines),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    for name, title, lines in SECTIONS:
        record = load(args.dir, name)
        print(f"{title} ({name}.json{', ' + record['created'] if record else ''})")
        print("\n".join(lines(record)) if record else "  missing: run `make bench`")


if __name__ == "__main__":
    main()
