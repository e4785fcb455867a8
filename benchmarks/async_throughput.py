"""Synchronous vs overlapped GRPO on one machine: throughput, and accuracy after the same training time.

    .venv/bin/python benchmarks/async_throughput.py                 # 3 seeds, 120 s of training per mode
    .venv/bin/python benchmarks/async_throughput.py --seeds 0 --train-seconds 60
    .venv/bin/python benchmarks/async_throughput.py --smoke         # CI: 1 seed, 2 steps each
    .venv/bin/python benchmarks/async_throughput.py --task calculator --seeds 0 --sft-epochs 8 \
        --modes sync_separate,async --name async_throughput_calculator    # multi-turn, tool calls

The demo task (`quartet demo`: a tiny Qwen2 learning 2-digit addition) from an SFT start made once per seed,
then the same GRPO config (with `actor.tis_cap=2`, a no-op on-policy; `--override` adds more) in four
ways, one after another in one process and one local Ray of `--cpus` CPUs (the same share for all four):
- `sync_colocated`: actor and rollout in one host process holding every CPU (quartet's default);
- `sync_separate`: the rollout on a pool of its own (half the CPUs each), weights streamed after each update;
- `one_step_off`: separate pools, batch k+1 generated while the actor trains on batch k;
- `async`: separate pools, `--async-buffer` batches generated ahead, staleness bounded by `--max-staleness`
  (admission control; `--modes ...,async_drop` adds the drop-and-regenerate policy, not run by default).
Each mode trains until its steps add up to `--train-seconds` (`timing_s/step`, start-up excluded; or for
`--train-steps` steps, whichever comes first), then the checkpoint it stops with is exported and scored
greedily on the same 200 held-out problems. Reported per mode and seed: steps, steps/min, samples/s, the
ratio to `sync_separate` in samples/s, the pools' idle time and overlap, the mean staleness, and the
accuracy. The modes' order rotates with the seed, so a slow stretch of the machine does not always hit the
same mode. Writes `benchmarks/results/<name>.json`.
`--task calculator` runs the multi-turn tool-use demo instead (conversations of up to 3 model turns, the
calculator tool between them): generation is a larger share of its step, as in agentic RL.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import table, write_result

from quartet.trainer.callbacks import RunCallbacks

MODES: dict[str, list[str]] = {
    "sync_colocated": ["trainer.mode=sync"],
    "sync_separate": ["trainer.mode=sync", "cluster.separate_pools=[rollout]"],
    "one_step_off": ["trainer.mode=one_step_off", "cluster.separate_pools=[rollout]"],
    "async": ["trainer.mode=async", "cluster.separate_pools=[rollout]"],
    # async with the drop policy instead of admission control: differs only with a bound below the buffer
    "async_drop": [
        "trainer.mode=async",
        "trainer.staleness_control=drop",
        "cluster.separate_pools=[rollout]",
    ],
}
DEFAULT_MODES = ("sync_colocated", "sync_separate", "one_step_off", "async")
BASELINE = "sync_separate"


class _TrainFor(RunCallbacks):
    """Stops a run once its training steps add up to `seconds` (start-up and validation excluded), or
    after `steps` steps: a count, so that a smoke run does the same work however busy the machine is.
    None: no bound of that kind."""

    def __init__(self, seconds: float | None, steps: int | None = None) -> None:
        self.seconds, self.spent, self.max_steps = seconds, 0.0, steps
        self.steps: list[dict[str, Any]] = []

    def on_record(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "step":
            self.spent += float(record["timing_s/step"])
            self.steps.append(record)

    def should_stop(self, step: int, steps_this_process: int) -> bool:
        counted = self.max_steps is not None and len(self.steps) >= self.max_steps
        return counted or (self.seconds is not None and self.spent >= self.seconds)


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records[1:] if key in r]  # the first step waits for a cold pipeline
    return statistics.fmean(values) if values else None


def run_mode(
    name: str, seed: int, sft_dir: str, base: list[str], out: Path, stop: _TrainFor, cpus: int, task: str
) -> dict[str, Any]:
    """One mode from the SFT start until `stop` says so; its figures and held-out accuracy."""
    from quartet.demo.pipeline import demo_config, greedy_accuracy
    from quartet.trainer import RLTrainer
    from quartet.trainer.checkpoint import list_checkpoints
    from quartet.trainer.export import export_checkpoint

    pool = [f"cluster.cpus_per_bundle={cpus if name == 'sync_colocated' else cpus // 2}"]
    overrides = [*base, *MODES[name], *pool, f"model.path={sft_dir}", f"trainer.experiment_name={name}"]
    cfg = demo_config(overrides, seed, quick=False, task=task)
    began = time.perf_counter()
    result = RLTrainer(cfg, callbacks=stop).run()
    wall = time.perf_counter() - began
    checkpoint = list_checkpoints(result.run_dir)[-1]
    hf = export_checkpoint(checkpoint, out / f"{name}-seed{seed}-hf")
    val_file = str(result.run_dir / "data" / cfg.data.builtin_task.value / "rl_val.parquet")
    correct, total = greedy_accuracy(cfg, str(hf), val_file)
    samples = result.steps * cfg.data.train_batch_size * cfg.rollout.n
    records = stop.steps
    return {
        "mode": name,
        "seed": seed,
        "steps": result.steps,
        "train_s": result.train_seconds,
        "process_s": wall,
        "samples": samples,
        "samples_per_s": samples / result.train_seconds,
        "steps_per_min": 60 * result.steps / result.train_seconds,
        "accuracy": correct / total,
        "correct": correct,
        "total": total,
        "gen_wait_s": _mean(records, "timing_s/gen"),
        "trainer_idle_s": _mean(records, "timing_s/trainer_idle"),
        "rollout_idle_s": _mean(records, "timing_s/rollout_idle"),
        "overlap": _mean(records, "perf/overlap"),
        "staleness_mean": _mean(records, "async/staleness_mean"),
        "spanning_updates": _mean(records, "async/spanning_updates"),
        "dropped_stale": sum(float(r.get("async/dropped_stale", 0.0)) for r in records),
        "admission_wait_s": _mean(records, "async/admission_wait_s"),
        "step_s": [float(r["timing_s/step"]) for r in records],
    }


def sft_start(seed: int, base: list[str], epochs: int, task: str) -> tuple[str, float]:
    """The seed's SFT start (the demo's, with `epochs`): its folder and held-out accuracy."""
    from quartet.demo.pipeline import demo_config
    from quartet.sft import SFTTrainer

    overrides = [*base, f"sft.epochs={epochs}", "trainer.experiment_name=sft_start"]
    cfg = demo_config(overrides, seed, quick=False, task=task)
    result = SFTTrainer(cfg).run()
    return str(result.hf_dir), float(result.train_seconds)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: mean figures over seeds and the ratio to `sync_separate` (samples/s, same seed)."""
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        ratios = []
        for r in mine:
            base = [b for b in rows if b["mode"] == BASELINE and b["seed"] == r["seed"]]
            if base:
                ratios.append(r["samples_per_s"] / base[0]["samples_per_s"])
        out[mode] = {
            "samples_per_s": statistics.fmean(r["samples_per_s"] for r in mine),
            "steps_per_min": statistics.fmean(r["steps_per_min"] for r in mine),
            "accuracy": statistics.fmean(r["accuracy"] for r in mine),
            "accuracy_by_seed": [r["accuracy"] for r in mine],
            "ratio_to_sync_separate": statistics.fmean(ratios) if ratios else None,
            "ratio_by_seed": ratios,
            "overlap": _maybe_mean([r["overlap"] for r in mine]),
            "staleness_mean": _maybe_mean([r["staleness_mean"] for r in mine]),
        }
    return out


def _maybe_mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--task",
        default="arithmetic",
        help="the demo task: arithmetic, or calculator (multi-turn, tool calls)",
    )
    parser.add_argument("--train-seconds", type=float, default=120.0)
    parser.add_argument("--train-steps", type=int, default=None, help="stop after this many steps at most")
    parser.add_argument("--sft-epochs", type=int, default=60, help="SFT start (the demo uses 160)")
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray, shared by all modes")
    parser.add_argument("--async-buffer", type=int, default=2)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"any of {', '.join(MODES)}")
    parser.add_argument(
        "--override",
        action="append",
        default=["actor.tis_cap=2.0"],
        help="config overrides for every mode (default: actor.tis_cap=2.0, which is a no-op on-policy)",
    )
    parser.add_argument("--smoke", action="store_true", help="CI: one seed, 2 steps per mode")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--name", default="async_throughput")
    args = parser.parse_args()
    if args.smoke:  # the two ends of the comparison; the other modes have tests of their own
        # a step count, not seconds: on a busy machine 3 s of steps was 1 step, too few for the figures
        args.seeds, args.train_seconds, args.train_steps, args.sft_epochs = "0", None, 2, 1
        args.modes = "sync_separate,async"
    import ray

    ray.init(address="local", num_cpus=args.cpus, namespace="quartet", log_to_driver=False)
    seeds = [int(s) for s in args.seeds.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; choose from {list(MODES)}")
    rows: list[dict[str, Any]] = []
    starts: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="quartet-async-bench-") as tmp:
        out = Path(tmp)
        for seed in seeds:
            base = [
                f"trainer.output_dir={out / f'seed{seed}'}",
                "trainer.total_steps=100000",
                "trainer.test_freq=0",
                "trainer.val_before_train=false",
                "trainer.save_freq=0",
                "trainer.export_final=false",
                "trainer.loggers=[jsonl]",
                f"trainer.async_buffer={args.async_buffer}",
                f"trainer.max_staleness={args.max_staleness}",
                *args.override,
            ]
            sft_dir, starts[seed] = sft_start(seed, base, args.sft_epochs, args.task)
            order = modes[seed % len(modes) :] + modes[: seed % len(modes)]
            for mode in order:
                stop = _TrainFor(args.train_seconds, args.train_steps)
                row = run_mode(mode, seed, sft_dir, base, out, stop, args.cpus, args.task)
                rows.append(row)
                print(
                    f"seed {seed} {mode:15s} steps {row['steps']:4d}  {row['samples_per_s']:7.1f} samples/s  "
                    f"accuracy {row['accuracy']:.3f}",
                    flush=True,
                )
    summary = summarise(rows)
    settings = {k: v for k, v in vars(args).items() if k != "out_dir"} | {"sft_seconds": starts}
    path = write_result(args.name, settings, rows, summary, args.out_dir)
    headers = ["mode", "samples/s", "x sync_separate", "steps/min", "overlap", "staleness", "accuracy"]
    body = [
        [
            m,
            f"{s['samples_per_s']:.1f}",
            "" if s["ratio_to_sync_separate"] is None else f"{s['ratio_to_sync_separate']:.2f}",
            f"{s['steps_per_min']:.1f}",
            "" if s["overlap"] is None else f"{s['overlap']:.2f}",
            "" if s["staleness_mean"] is None else f"{s['staleness_mean']:.2f}",
            " / ".join(f"{a:.3f}" for a in s["accuracy_by_seed"]),
        ]
        for m, s in summary.items()
    ]
    print(table(headers, body))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
