"""Partial rollouts in a multi-turn async run: how often a conversation spans a weight update.

    .venv/bin/python benchmarks/async_multi_turn.py     # 10 steps x 3 seeds, the calculator demo's config

The calculator task (`quartet demo --task calculator`: up to 3 model turns with the calculator tool between
them) from the tiny model the code builds, with the rollout on a pool of its own and `trainer.mode=async`
(`async_buffer` 2, `max_staleness` 2, weights applied between decode steps, `actor.tis_cap=2`). Per step:
`async/spanning_updates` (the share of conversations whose model-written tokens come from more than one
weight version: an update landed while they were being generated, and they went on with the new weights),
the staleness and the overlap. No learning is claimed here (no SFT start): this measures the pipeline.
Writes `benchmarks/results/async_multi_turn.json`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from common import table, write_result

KEYS = (
    "async/spanning_updates",
    "async/staleness_mean",
    "async/staleness_max",
    "perf/overlap",
    "timing_s/step",
)


def run_seed(seed: int, total_steps: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One async run of the calculator task: its per-step figures and totals."""
    from quartet.demo.pipeline import demo_config
    from quartet.trainer import RLTrainer

    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="quartet-async-mt-") as tmp:
        overrides = [
            f"trainer.output_dir={tmp}",
            f"trainer.total_steps={total_steps}",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.save_freq=0",
            "trainer.export_final=false",
            "trainer.loggers=[jsonl]",
            "trainer.mode=async",
            "cluster.separate_pools=[rollout]",
            "cluster.cpus_per_bundle=1",
            "cluster.num_cpus=2",
            "actor.tis_cap=2.0",
            "trainer.experiment_name=async-multi-turn",
        ]
        cfg = demo_config(overrides, seed, quick=False, task="calculator")
        began = time.perf_counter()
        RLTrainer(cfg, on_record=records.append).run()
        wall = time.perf_counter() - began
    steps = [
        {"step": r["step"], **{k: float(r[k]) for k in KEYS if k in r}}
        for r in records
        if r["kind"] == "step"
    ]
    samples = cfg.data.train_batch_size * cfg.rollout.n
    spanning = sum(round(s["async/spanning_updates"] * samples) for s in steps)
    return steps, {
        "steps": len(steps),
        "conversations": samples * len(steps),
        "spanning_conversations": spanning,
        "steps_with_spanning": sum(1 for s in steps if s["async/spanning_updates"] > 0),
        "staleness_max": max(s["async/staleness_max"] for s in steps),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    per_seed: dict[int, dict[str, Any]] = {}
    for seed in [int(x) for x in args.seeds.split(",")]:
        steps, summary = run_seed(seed, args.steps)
        rows += [{"seed": seed, **s} for s in steps]
        per_seed[seed] = summary
        print(f"seed {seed}: {summary}", flush=True)
    conversations = sum(s["conversations"] for s in per_seed.values())
    spanning = sum(s["spanning_conversations"] for s in per_seed.values())
    summary = {
        "per_seed": per_seed,
        "conversations": conversations,
        "spanning_conversations": spanning,
        "spanning_share": spanning / conversations,
        "staleness_max": max(s["staleness_max"] for s in per_seed.values()),
    }
    settings = {
        "steps": args.steps,
        "seed": args.seed,
        "task": "calculator",
        "async_buffer": 2,
        "max_staleness": 2,
    }
    path = write_result("async_multi_turn", settings, steps, summary, args.out_dir)
    print(table(["step", *KEYS], [[s["step"], *(f"{s.get(k, 0.0):.3f}" for k in KEYS)] for s in steps]))
    print(summary)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
