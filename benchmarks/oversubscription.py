"""Training steps when two processes share the cores: how much OpenMP's wait policy matters.

    .venv/bin/python benchmarks/oversubscription.py [--threads 2] [--steps 30]

Each worker is a fresh process that trains the demo-size model (fp32, `--threads` torch threads, SFT-shaped
batches of 32 x 128 tokens) and reports its median step time. Per wait policy (OpenMP's default, and
`OMP_WAIT_POLICY=PASSIVE`): one worker alone, then two at once on the same cores. With the default, an idle
OpenMP thread spins for a while before it sleeps, which takes a core from the other process; a passive
thread sleeps at once. Rounds alternate the policies. Results: `benchmarks/results/oversubscription.json`.
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
print(json.dumps({"median_s": statistics.median(times[3:]), "times": times}))
"""


def run_workers(count: int, policy: str | None, threads: int, steps: int) -> list[float]:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
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
    return [float(o["median_s"]) for o in out]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    policies = {"default": None, "passive": "PASSIVE"}
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        order = list(policies.items()) if r % 2 == 0 else list(policies.items())[::-1]
        for name, policy in order:
            for count in (1, 2):
                began = time.perf_counter()
                medians = run_workers(count, policy, args.threads, args.steps)
                runs.append({"round": r, "policy": name, "processes": count, "step_s": medians})
                print(f"round {r} {name:8s} x{count}: {[round(m, 3) for m in medians]} "
                      f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    summary: dict[str, Any] = {}
    for name in policies:
        alone = statistics.median(
            m for r in runs if r["policy"] == name and r["processes"] == 1 for m in r["step_s"]
        )
        shared = statistics.median(
            m for r in runs if r["policy"] == name and r["processes"] == 2 for m in r["step_s"]
        )
        summary[name] = {
            "alone_s": round(alone, 4),
            "shared_s": round(shared, 4),
            "slowdown": round(shared / alone, 2),
        }
    for name, s in summary.items():
        print(f"{name:8s} alone {s['alone_s']:.3f} s  two at once {s['shared_s']:.3f} s  ({s['slowdown']}x)")
    settings = {"threads": args.threads, "steps": args.steps, "rounds": args.rounds}
    path = write_result("oversubscription", settings, runs, summary, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
