"""Synchronous vs overlapped GRPO on one machine: throughput, and accuracy after the same training time.

    .venv/bin/python benchmarks/async_throughput.py                 # 3 seeds, 120 s of training per mode
    .venv/bin/python benchmarks/async_throughput.py --seeds 0 --train-seconds 60
    .venv/bin/python benchmarks/async_throughput.py --smoke         # CI: 1 seed, 2 steps each
    .venv/bin/python benchmarks/async_throughput.py --task calculator --seeds 0 --sft-epochs 8 \
        --modes sync_separate,async --name async_throughput_calculator    # multi-turn, tool calls
    .venv/bin/python benchmarks/async_throughput.py --workload long       # generation-dominated

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
`--workload long` is generation-dominated: the built-in counting task (`Count from 137 to 420` -> the run
written out) with responses of `--response-length` tokens (320 by default, cut there: no run fits, so the
score is the partial credit, the share of the run counted right, not an exact-answer accuracy),
`--prompts` (2) x 4 samples a step, an SFT start on counting traces; modes sync_separate, one_step_off and
async. Each row
records the generation share of its step (the rollout's busy time over the step; in sync_separate the
ceiling of any overlap is step / max(generation, training)), the samples dropped for staleness, and the
split advisor's line (`quartet.trainer.records.split_advice`) from its steps.
`--splits R:T,...` (async only) runs the async mode at each rollout:trainer split of CPUs
(`cluster.pool_cpus`), to check the advisor's recommendation against other splits.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from common import table, write_result

from quartet.trainer.records.callbacks import RunCallbacks

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
LONG_MODES = ("sync_separate", "one_step_off", "async")
BASELINE = "sync_separate"


def long_overrides(response_length: int, prompts: int = 8) -> list[str]:
    """`--workload long`: the counting task, responses cut at `response_length` tokens (a run of 250-500
    integers is ~1,000-2,000 tokens with the tiny tokenizer, so every response runs to the cut), `prompts`
    prompts x 4 samples a step, and an SFT start on the same traces cut short."""
    total = response_length + 64
    return [
        "data.builtin_task=counting",
        "data.builtin_train_size=4096",
        "data.builtin_val_size=32",
        "data.max_prompt_length=64",
        f"data.max_response_length={response_length}",
        f"data.train_batch_size={prompts}",
        "data.val_batch_size=32",
        "rollout.n=4",
        f"actor.mini_batch_size={prompts}",
        f"actor.micro_batch_size_per_device={4 * prompts}",
        f"actor.logprobs.micro_batch_size_per_device={4 * prompts}",
        f"model.tiny.max_position_embeddings={max(512, total)}",
        # SFT on the runs' first ~64 tokens: enough to copy the start and count on (4 epochs: partial
        # credit 0.05-0.16 on 4 held-out prompts, where traces of the full length learned to count from a
        # wrong start and scored 0); the response length is RL's
        "sft.builtin.task=counting",
        "sft.builtin.train_size=1024",
        "sft.builtin.val_size=16",
        "sft.max_length=128",
        "sft.truncate=true",
        "sft.batch_size=32",
        "sft.micro_batch_size_per_device=32",
    ]


def split_mode(split: str) -> tuple[str, list[str]]:
    """`R:T` -> async with R CPUs for the rollout pool and T for the trainer's (`cluster.pool_cpus`)."""
    rollout, trainer = (int(x) for x in split.split(":"))
    label = f"async@{rollout}:{trainer}"
    return label, [
        *MODES["async"],
        f"cluster.pool_cpus.rollout={rollout}",
        f"cluster.pool_cpus.main={trainer}",
    ]


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


def _pools(cfg: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each pool's busy seconds per step, the generation share of the step, the ceiling of overlap
    (step / max(generation, training)) and the split advisor's line, from the steps after the first."""
    from quartet.trainer.records.split_advice import busy_times
    from quartet.trainer.records.split_advice_log import advice_for, render_advice

    gen, train = busy_times(records[1:] or records)
    if not gen:
        return {}
    g, t = statistics.fmean(gen), statistics.fmean(train)
    step = statistics.fmean(float(r["timing_s/step"]) for r in records[1:] or records)
    found = advice_for(cfg, gen, train)
    return {
        "gen_busy_s": g,
        "train_busy_s": t,
        "gen_share": g / step,
        "overlap_ceiling": step / max(g, t, 1e-9),
        "split_advice": render_advice(cfg, *found) if found else None,
    }


def greedy_scores(cfg: Any, model_dir: str, val_file: str) -> list[float]:
    """The task's score of each greedy answer to `val_file`'s prompts (single-turn): the partial credit
    of the counting task, where an exact answer cannot fit in the response length."""
    from quartet.data.prompts import PromptDataset
    from quartet.models.loading import load_tokenizer
    from quartet.rollout import SamplingParams, TorchRolloutEngine, requests_from_batch
    from quartet.tasks import task_scorer

    tokenizer = load_tokenizer(model_dir)
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.data.max_response_length)
    with TorchRolloutEngine.from_pretrained(model_dir, max_num_seqs=cfg.rollout.max_num_seqs) as engine:
        data = PromptDataset.from_files([val_file], cfg.data, tokenizer)
        batch = data.batch(list(range(len(data))))
        outputs = engine.generate(requests_from_batch(batch, params))
    scores = []
    for i, outs in enumerate(outputs):
        text = str(tokenizer.decode(list(outs[0].token_ids), skip_special_tokens=True))
        scorer = task_scorer(batch.non_tensors["data_source"][i])
        assert scorer is not None, "a built-in task"
        scores.append(float(scorer(text, batch.non_tensors["ground_truth"][i], None)))
    return scores


def run_mode(
    name: str,
    seed: int,
    sft_dir: str,
    base: list[str],
    out: Path,
    stop: _TrainFor,
    cpus: int,
    task: str,
    mode_overrides: list[str] | None = None,
) -> dict[str, Any]:
    """One mode from the SFT start until `stop` says so; its figures and held-out accuracy (and mean
    score: the counting task's partial credit)."""
    from quartet.demo.pipeline import demo_config, greedy_accuracy
    from quartet.trainer import RLTrainer
    from quartet.trainer.recovery.checkpoint import list_checkpoints
    from quartet.trainer.recovery.export import export_checkpoint

    pool = [f"cluster.cpus_per_bundle={cpus if name == 'sync_colocated' else cpus // 2}"]
    mode = MODES[name] if mode_overrides is None else mode_overrides
    run_name = name.replace("@", "_").replace(":", "-")
    overrides = [*base, *mode, *pool, f"model.path={sft_dir}", f"trainer.experiment_name={run_name}"]
    cfg = demo_config(overrides, seed, quick=False, task=task)
    began = time.perf_counter()
    result = RLTrainer(cfg, callbacks=stop).run()
    wall = time.perf_counter() - began
    checkpoint = list_checkpoints(result.run_dir)[-1]
    hf = export_checkpoint(checkpoint, out / f"{run_name}-seed{seed}-hf")
    val_file = str(result.run_dir / "data" / cfg.data.builtin_task.value / "rl_val.parquet")
    if cfg.rollout.multi_turn.enable:
        correct, total = greedy_accuracy(cfg, str(hf), val_file)
        score = correct / total
    else:
        scores = greedy_scores(cfg, str(hf), val_file)
        correct, total, score = sum(x >= 1.0 for x in scores), len(scores), statistics.fmean(scores)
    samples = result.steps * cfg.data.train_batch_size * cfg.rollout.n
    records = stop.steps
    return _pools(cfg, records) | {
        "mode": name,
        "seed": seed,
        "steps": result.steps,
        "train_s": result.train_seconds,
        "process_s": wall,
        "samples": samples,
        "samples_per_s": samples / result.train_seconds,
        "steps_per_min": 60 * result.steps / result.train_seconds,
        "accuracy": correct / total,
        "score": score,
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
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
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
            "score": statistics.fmean(r["score"] for r in mine),
            "score_by_seed": [r["score"] for r in mine],
            "gen_share": _maybe_mean([r.get("gen_share") for r in mine]),
            "overlap_ceiling": _maybe_mean([r.get("overlap_ceiling") for r in mine]),
            "dropped_stale": sum(r["dropped_stale"] for r in mine),
            # the ceiling of any overlap, from the sync_separate runs: their step / max(gen, train)
            "sync_gen_share": _maybe_mean([b.get("gen_share") for b in rows if b["mode"] == BASELINE]),
            "sync_overlap_ceiling": _maybe_mean(
                [b.get("overlap_ceiling") for b in rows if b["mode"] == BASELINE]
            ),
            "trainer_idle_s": _maybe_mean([r["trainer_idle_s"] for r in mine]),
            "rollout_idle_s": _maybe_mean([r["rollout_idle_s"] for r in mine]),
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
    parser.add_argument(
        "--workload",
        choices=["default", "long"],
        default="default",
        help="long: the counting task, long responses, generation-dominated (sets its own modes)",
    )
    parser.add_argument("--response-length", type=int, default=320, help="--workload long: tokens")
    parser.add_argument("--prompts", type=int, default=2, help="--workload long: prompts a step (x 4)")
    parser.add_argument(
        "--splits", default="", help="async at these rollout:trainer CPU splits, e.g. 1:1,2:1,1:2"
    )
    parser.add_argument("--train-seconds", type=float, default=120.0)
    parser.add_argument("--train-steps", type=int, default=None, help="stop after this many steps at most")
    parser.add_argument(
        "--sft-epochs",
        type=int,
        default=None,
        help="SFT start (default 60, --workload long 4; the demo uses 160)",
    )
    parser.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray, shared by all modes")
    parser.add_argument("--async-buffer", type=int, default=2)
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--modes", default=None, help=f"any of {', '.join(MODES)}")
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
    long = args.workload == "long"
    if args.modes is None:
        args.modes = ",".join(LONG_MODES if long else DEFAULT_MODES)
    if args.sft_epochs is None:
        args.sft_epochs = 4 if long else 60
    if long:
        args.override = [*long_overrides(args.response_length, args.prompts), *args.override]
    if args.smoke:  # the two ends of the comparison; the other modes have tests of their own
        # a step count, not seconds: on a busy machine 3 s of steps was 1 step, too few for the figures
        args.seeds, args.train_seconds, args.train_steps, args.sft_epochs = "0", None, 2, 1
        args.modes = "sync_separate,async"
    splits = dict(split_mode(x) for x in args.splits.split(",") if x)
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
            every = [*modes, *splits]
            order = every[seed % len(every) :] + every[: seed % len(every)]
            for mode in order:
                stop = _TrainFor(args.train_seconds, args.train_steps)
                mode_overrides = splits.get(mode)
                row = run_mode(mode, seed, sft_dir, base, out, stop, args.cpus, args.task, mode_overrides)
                rows.append(row)
                print(
                    f"seed {seed} {mode:15s} steps {row['steps']:4d}  {row['samples_per_s']:7.1f} samples/s  "
                    f"accuracy {row['accuracy']:.3f}  score {row['score']:.3f}  "
                    f"generation share {row.get('gen_share', float('nan')):.2f}",
                    flush=True,
                )
                if row.get("split_advice"):
                    print(f"  {row['split_advice']}", flush=True)
    summary = summarise(rows)
    settings = {k: v for k, v in vars(args).items() if k != "out_dir"} | {"sft_seconds": starts}
    path = write_result(args.name, settings, rows, summary, args.out_dir)
    headers = ["mode", "samples/s", "x sync_separate", "steps/min", "overlap", "staleness", "accuracy"]
    headers += ["score", "gen share", "ceiling", "dropped"]
    body = [
        [
            m,
            f"{s['samples_per_s']:.1f}",
            "" if s["ratio_to_sync_separate"] is None else f"{s['ratio_to_sync_separate']:.2f}",
            f"{s['steps_per_min']:.1f}",
            "" if s["overlap"] is None else f"{s['overlap']:.2f}",
            "" if s["staleness_mean"] is None else f"{s['staleness_mean']:.2f}",
            " / ".join(f"{a:.3f}" for a in s["accuracy_by_seed"]),
            " / ".join(f"{a:.3f}" for a in s["score_by_seed"]),
            "" if s["gen_share"] is None else f"{s['gen_share']:.2f}",
            "" if s["overlap_ceiling"] is None else f"{s['overlap_ceiling']:.2f}",
            f"{s['dropped_stale']:g}",
        ]
        for m, s in summary.items()
    ]
    print(table(headers, body))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
