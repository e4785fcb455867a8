"""Routing replay (R3) in training: GRPO on the tiny Qwen3-MoE of examples/moe, replay off vs on, 3 seeds.

The realistic case of the issue: the built-in engine samples in bfloat16 (`rollout.dtype=bfloat16`) beside
a float32 trainer, so the two route some tokens to different experts. Both arms record the engine's routing
(`rollout.record_routing=true`: the same cost, and `moe/routing_mismatch` in both); one trains with its own
routing (`actor.routing_replay=off`), the other routes as the engine did (`rollout`).

Every run starts from one SFT warm start (the example's `sft:` section, trained once, seed 0), so the arms
differ only by replay and by the RL seed (`trainer.seed`, `data.seed`, `rollout.seed`); each RL step makes
four optimizer steps (`PPO_EPOCH`). Each run is
`quartet train examples/moe/config.yaml` in its own process on the local backend (the roles in the driver:
the trainer's code path without Ray's start-up), for `--steps` steps, validating every `--test-freq`.

Per run it keeps, per step: the training reward, the held-out accuracy, `rollout/logprob_diff_mean` and
`_max` (|engine - trainer| log-prob of the sampled tokens, as the old-log-prob pass sees them: with replay
on, that pass routes as the engine did), `moe/routing_mismatch`, `actor/ppo_kl`, `actor/pg_clipfrac` and
`actor/grad_norm`; a grad-norm spike is a step whose norm exceeds 3x the run's median.

    .venv/bin/python benchmarks/moe_replay_grpo.py                # 3 seeds x 2 arms x 40 steps
    .venv/bin/python benchmarks/moe_replay_grpo.py --smoke        # 1 seed x 2 arms x 2 steps, tiny SFT

Results: `benchmarks/results/moe_replay_grpo.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, table, write_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "moe" / "config.yaml"
QUARTET = Path(sys.executable).parent / "quartet"
ARMS = {"replay_off": "off", "replay_on": "rollout"}
KEPT = (
    "critic/score/mean",
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "moe/routing_mismatch",
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/grad_norm",
    "response_length/mean",
)
VAL = "val-core/arithmetic/reward/mean@1"
PPO_EPOCH = ("actor.mini_batch_size=8", "actor.micro_batch_size_per_device=64")
"""Four optimizer steps per RL step (32 prompts in mini-batches of 8): the old-log-prob pass runs (so
`moe/routing_mismatch` is measured: an on-policy single update takes old log-probs from the update's own
forward) and the ratio, the clip fraction and `actor/ppo_kl` move after the first mini-batch."""
SPIKE = 3.0
"""A grad-norm spike: a step whose `actor/grad_norm` exceeds this times the run's median."""


def _train(args: list[str], log: Path) -> float:
    """`quartet train` in its own process; its wall time. Its output goes to `log`; a failure raises with
    the log's tail."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            [str(QUARTET), "train", *args], stdout=out, stderr=subprocess.STDOUT, timeout=7200
        )
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"quartet train {' '.join(args)} exited {done.returncode}:\n{tail}")
    return time.perf_counter() - start


def _records(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The run's step records and validation records, from its metrics.jsonl."""
    steps, vals = [], []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "step":
            steps.append(rec)
        elif VAL in rec.get("metrics", rec):
            vals.append(rec)
    return steps, vals


def _value(rec: dict[str, Any], key: str) -> float | None:
    metrics = rec.get("metrics", rec)
    got = metrics.get(key)
    return None if got is None else float(got)


def summarize_run(steps: list[dict[str, Any]], vals: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step curves of `KEPT`, the validation curve, and the run's means and grad-norm spikes."""
    curves = {key: [_value(rec, key) for rec in steps] for key in KEPT}
    val_curve = [[int(rec.get("step", 0)), _value(rec, VAL)] for rec in vals]
    means = {
        key: statistics.fmean(v for v in vals_ if v is not None)
        for key, vals_ in curves.items()
        if any(v is not None for v in vals_)
    }
    norms = [v for v in curves["actor/grad_norm"] if v is not None]
    median = statistics.median(norms) if norms else 0.0
    spikes = sum(1 for v in norms if median > 0 and v > SPIKE * median)
    return {"curves": curves, "val": val_curve, "means": means, "grad_norm_spikes": spikes,
            "grad_norm_max": max(norms, default=0.0)}  # fmt: skip


def summarize(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Per arm, over its seeds: the mean of each run's mean of the step metrics, the mean of each run's
    largest per-token gap (`logprob_diff_max_run`: the worst token of the run), the mean final held-out
    accuracy, and the grad-norm spikes of all its runs."""
    summary: dict[str, float] = {}
    for arm in ARMS:
        mine = [r for name, r in runs.items() if name.startswith(arm)]
        for key in ("rollout/logprob_diff_mean", "rollout/logprob_diff_max", "moe/routing_mismatch",
                    "actor/ppo_kl", "actor/pg_clipfrac", "critic/score/mean"):  # fmt: skip
            got = [r["means"][key] for r in mine if key in r["means"]]
            if got:
                summary[f"{arm}/{key}"] = statistics.fmean(got)
        worst = [max(v for v in r["curves"]["rollout/logprob_diff_max"] if v is not None) for r in mine]
        summary[f"{arm}/rollout/logprob_diff_max_run"] = statistics.fmean(worst)
        finals = [r["val"][-1][1] for r in mine if r["val"] and r["val"][-1][1] is not None]
        if finals:
            summary[f"{arm}/final_val_accuracy"] = statistics.fmean(finals)
        summary[f"{arm}/grad_norm_spikes"] = float(sum(r["grad_norm_spikes"] for r in mine))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="1 seed, 2 steps, a tiny SFT (CI)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="keep the runs here (default: a temp dir)"
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    seeds, steps, test_freq = (1, 2, 2) if args.smoke else (args.seeds, args.steps, args.test_freq)
    sft = ["sft.epochs=1", "sft.builtin.train_size=64"] if args.smoke else []
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        base = [
            str(CONFIG),
            f"trainer.output_dir={work}",
            "trainer.project_name=replay",
            "cluster.backend=local",
        ]
        # The warm start alone: one RL step after it, whose run folder is discarded.
        warm_s = _train([*base, *sft, "trainer.experiment_name=base", "trainer.total_steps=1",
                         "trainer.test_freq=0", "trainer.export_final=false"], work / "warm.log")  # fmt: skip
        hf = work / "replay" / "base-sft_start" / "hf"
        runs: dict[str, dict[str, Any]] = {}
        for seed in range(seeds):
            for arm, replay in ARMS.items():
                name = f"{arm}-seed{seed}"
                seeded = [f"trainer.seed={seed}", f"data.seed={seed}", f"rollout.seed={seed}"]
                wall = _train([*base, f"model.path={hf}", "trainer.sft_warm_start=false", *seeded,
                               f"trainer.experiment_name={name}", f"trainer.total_steps={steps}",
                               f"trainer.test_freq={test_freq}", "trainer.export_final=false",
                               "rollout.dtype=bfloat16", "rollout.record_routing=true", *PPO_EPOCH,
                               f"actor.routing_replay={replay}"], work / f"{name}.log")  # fmt: skip
                runs[name] = summarize_run(*_records(work / "replay" / name)) | {"wall_s": wall}
    summary = summarize(runs)
    settings = {
        "config": "examples/moe/config.yaml",
        "engine_dtype": "bfloat16",
        "trainer_dtype": "float32",
        "seeds": seeds,
        "steps": steps,
        "test_freq": test_freq,
        "warm_start_s": warm_s,
        "spike_rule": f"grad_norm > {SPIKE} x the run's median",
        "backend": "local",
        "command": "benchmarks/moe_replay_grpo.py" + (" --smoke" if args.smoke else ""),
    }
    write_result("moe_replay_grpo", settings, {"runs": runs}, summary, out_dir=args.out_dir)
    print(table(["metric", "value"], [[key, value] for key, value in sorted(summary.items())]))


if __name__ == "__main__":
    main()
