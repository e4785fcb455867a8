"""Time to accuracy: wall time for GRPO to lift held-out accuracy to a threshold, quartet vs TRL.

    .venv/bin/python benchmarks/time_to_accuracy.py               # the demo's task and model (~4 min)
    .venv/bin/python benchmarks/time_to_accuracy.py --smoke

The demo's setting (`quartet demo`): a tiny Qwen2 built by the code gets a short SFT warm start on 512 worked
2-digit additions (quartet's SFT, once, on the local backend); both sides then run GRPO from that same
folder on the same fresh problems (the demo's RL prompt file) with the demo's GRPO settings (32 prompts x 8
samples, 8 new tokens, lr 2e-4, temperature 1, one optimizer step per step, fp32, one thread). Every
`--eval-every` steps the policy answers the 200 held-out problems greedily; the clock is the sum of the
steps' wall times up to the first evaluation at or above the threshold (evaluation time not counted on
either side: quartet evaluates with its rollout engine, TRL with transformers `generate`). The threshold is
the warm start's accuracy plus `--gain` (absolute). A side that does not get there within `--max-steps`
reports null. Round r samples with seed `--seed` + r on both sides (so rounds show the spread of learning,
not only of timing) and alternates which side runs first. Both sides run the same algorithm, so their
steps to the threshold differ by sampling luck only; the time is where they differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from common import spread, table, write_result
from grpo_runs import SMOKE_OVERRIDES, GrpoSettings, RunResult, Workdir, count_params, run_quartet, run_trl

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from trl_env import TRL_VERSION, ensure_trl_venv  # noqa: E402


def warm_start(workdir: Path, sft_epochs: int, seed: int) -> tuple[Workdir, float, Any]:
    """SFT the demo's model (local backend); the RL prompt files; the warm start's held-out accuracy."""
    from quartet.config.data import BuiltinTask
    from quartet.config.trainer import Logger
    from quartet.demo.pipeline import demo_config, greedy_accuracy
    from quartet.sft import SFTTrainer
    from quartet.tasks import ArithmeticSpec, write_builtin

    overrides = [
        f"sft.epochs={sft_epochs}",
        f"trainer.output_dir={workdir / 'sft'}",
        "cluster.backend=local",
        "trainer.resume=off",
    ]
    cfg = demo_config(overrides, seed, quick=False)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, loggers=(Logger.JSONL,)))
    hf_dir = SFTTrainer(cfg).run().hf_dir
    ops = tuple(op.symbol for op in cfg.data.builtin_operations)
    train, val = write_builtin(
        BuiltinTask.ARITHMETIC,
        workdir / "data",
        cfg.data.builtin_train_size,
        cfg.data.builtin_val_size,
        cfg.data.seed,
        spec=ArithmeticSpec(digits=cfg.data.builtin_digits, operations=ops),
    )
    correct, total = greedy_accuracy(cfg, str(hf_dir), str(val))
    return Workdir(Path(hf_dir), train, val, count_params(Path(hf_dir))), correct / total, cfg


def crossing(run: RunResult, threshold: float) -> dict[str, Any]:
    """The first evaluation at or above `threshold`: its step and the training seconds spent to get there."""
    for e in run.evals:
        if e["accuracy"] >= threshold - 1e-9:
            return {
                "step": int(e["step"]),
                "train_seconds": float(e["train_seconds"]),
                "accuracy": e["accuracy"],
            }
    return {
        "step": None,
        "train_seconds": None,
        "accuracy": max((e["accuracy"] for e in run.evals), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sft-epochs", type=int, default=40)
    parser.add_argument("--gain", type=float, default=0.075, help="threshold = warm-start accuracy + this")
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="2 SFT epochs, 2 GRPO steps, one round")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        args.sft_epochs, args.max_steps, args.eval_every, args.rounds = 2, 2, 1, 1
    torch.set_num_threads(args.threads)
    trl_python = ensure_trl_venv()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        w, start_acc, cfg = warm_start(workdir, args.sft_epochs, args.seed)
        threshold = min(start_acc + args.gain, 1.0)
        print(f"warm start: {start_acc:.1%} held-out accuracy; threshold {threshold:.1%}", flush=True)
        s = GrpoSettings(
            steps=args.max_steps,
            prompts_per_step=cfg.data.train_batch_size,
            n=cfg.rollout.n,
            max_prompt_length=cfg.data.max_prompt_length,
            max_new_tokens=cfg.data.max_response_length,
            temperature=cfg.rollout.temperature,
            lr=cfg.actor.optim.lr,
            dtype="float32",
            seed=args.seed,
            threads=args.threads,
            eval_every=args.eval_every,
            eval_size=cfg.data.builtin_val_size,
            target_accuracy=threshold,
            quartet_overrides=SMOKE_OVERRIDES if args.smoke else (),
        )
        runs: dict[str, list[RunResult]] = {"trl": [], "quartet": []}
        for r in range(args.rounds):
            seeded = dataclasses.replace(
                s, seed=args.seed + r
            )  # each round its own sampling; both sides alike
            for side in ["trl", "quartet"] if r % 2 == 0 else ["quartet", "trl"]:
                out, name = workdir / "runs" / f"{side}-{r}", f"tta-{side}-r{r}"
                run = (
                    run_quartet(w, seeded, out, name)
                    if side == "quartet"
                    else run_trl(trl_python, w, seeded, out, name)
                )
                runs[side].append(run)
                print(f"  round {r} {side}: {crossing(run, threshold)}", flush=True)
    crossings = {k: [crossing(r, threshold) for r in v] for k, v in runs.items()}
    summary: dict[str, Any] = {"warm_start_accuracy": start_acc, "threshold": threshold, "params": w.params}
    for side, cs in crossings.items():
        reached = [c["train_seconds"] for c in cs if c["train_seconds"] is not None]
        summary[side] = {
            "reached": f"{len(reached)}/{len(cs)}",
            "train_seconds_to_threshold": spread(reached),
            "steps_to_threshold": [c["step"] for c in cs],
            "step_s": spread([t for run in runs[side] for t in run.step_seconds[1:]]),
            "process_s": spread([run.process_seconds for run in runs[side]]),
        }
    q, t = summary["quartet"]["train_seconds_to_threshold"], summary["trl"]["train_seconds_to_threshold"]
    summary["trl_over_quartet"] = t["median"] / q["median"] if q["n"] and t["n"] else None
    rows = [
        [side, summary[side]["reached"], summary[side]["steps_to_threshold"],
         summary[side]["train_seconds_to_threshold"]["median"], summary[side]["step_s"]["median"],
         summary[side]["process_s"]["median"]]
        for side in ("trl", "quartet")
    ]  # fmt: skip
    print(f"threshold {threshold:.1%} (warm start {start_acc:.1%} + {args.gain:.0%})")
    print(table(["side", "reached", "steps", "train s to threshold", "step s", "process s"], rows))
    print(f"TRL / quartet time to accuracy: {summary['trl_over_quartet']}")
    settings = dataclasses.asdict(s) | {
        "seeds": [args.seed + r for r in range(args.rounds)],
        "sft_epochs": args.sft_epochs,
        "gain": args.gain,
        "rounds": args.rounds,
    }
    raw = {k: [vars(r) for r in v] for k, v in runs.items()} | {"crossings": crossings}
    path = write_result("time_to_accuracy", settings, raw, summary, args.out_dir, {"trl": TRL_VERSION})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
