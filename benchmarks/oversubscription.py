"""Training steps when two processes share the cores: how much OpenMP's wait policy matters.

    .venv/bin/python benchmarks/oversubscription.py [--threads 2] [--steps 30]

Each worker is a fresh process that trains the demo-size model (fp32, `--threads` torch threads, SFT-shaped
batches of 32 x 128 tokens) and reports its median step time. Per wait policy (OpenMP's default,
`OMP_WAIT_POLICY=PASSIVE`, and `GOMP_SPINCOUNT=10000`): one worker alone, then two at once on the same
cores. With the default, an idle OpenMP thread spins for a while before it sleeps, which takes a core from
the other process; a passive thread sleeps at once, a shorter spin count sleeps sooner. Rounds rotate
the policies' order. Results: `benchmarks/results/oversubscription.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402

WORKER = r"""
import json, statistics, sys, time
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
threads, steps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
torch.manual_seed(0)
shape = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
model = Qwen2ForCausalLM(Qwen2Config(vocab_size=512, intermediate_size=512, **shape))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(5, 500, (32, 128))
times = []
for _ in range(steps):
    start = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - start)
steady = times[3:]
print(json.dumps({"median_s": statistics.median(steady), "mean_s": statistics.fmean(steady), "times": times}))
"""


def run_workers(count: int, policy: dict[str, str], threads: int, steps: int) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env |= policy
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(threads), str(steps)],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    out = [json.loads(p.communicate(timeout=1200)[0].strip().splitlines()[-1]) for p in procs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    policies = {
        "default": {},
        "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
        "spin10k": {"GOMP_SPINCOUNT": "10000"},  # libgomp's default spins 300,000 times before sleeping
    }
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = list(policies.items())[r % 3 :] + list(policies.items())[: r % 3]
        for name, policy in order:
            for count in (1, 2):
                began = time.perf_counter()
                workers = run_workers(count, policy, args.threads, args.steps)
                wall = time.perf_counter() - began
                means = [float(w["mean_s"]) for w in workers]
                runs.append(
                    {"round": r, "policy": name, "processes": count, "wall_s": wall, "workers": workers}
                )
                print(
                    f"round {r} {name:8s} x{count}: mean step {[round(m, 3) for m in means]} ({wall:.0f} s)",
                    flush=True,
                )
    summary: dict[str, Any] = {}
    for name in policies:
        mine = {n: [r for r in runs if r["policy"] == name and r["processes"] == n] for n in (1, 2)}
        mean = {
            n: statistics.median(float(w["mean_s"]) for r in mine[n] for w in r["workers"]) for n in (1, 2)
        }
        wall = {n: statistics.median(float(r["wall_s"]) for r in mine[n]) for n in (1, 2)}
        summary[name] = {
            "alone_step_s": round(mean[1], 4),
            "shared_step_s": round(mean[2], 4),
            "slowdown": round(mean[2] / mean[1], 2),
            "alone_wall_s": round(wall[1], 1),
            "shared_wall_s": round(wall[2], 1),
        }
    for name, v in summary.items():
        print(
            f"{name:8s} mean step alone {v['alone_step_s']:.3f} s, two at once {v['shared_step_s']:.3f} s "
            f"({v['slowdown']}x); wall {v['alone_wall_s']} s and {v['shared_wall_s']} s"
        )
    settings = {"threads": args.threads, "steps": args.steps, "rounds": args.rounds}
    path = write_result("oversubscription", settings, runs, summary, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
