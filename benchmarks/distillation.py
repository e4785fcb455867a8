"""The distillation race: on-policy distillation vs GRPO vs SFT on teacher samples, at equal training time.

    .venv/bin/python benchmarks/distillation.py           # 3 seeds, the demo's task (docs/distillation.md)
    .venv/bin/python benchmarks/distillation.py --smoke   # a minute: the pipeline, not the figures

The demo's task (`quartet demo`: 2-digit addition, 512 worked examples, fresh verifiable problems, 200
held-out problems scored greedily by the exact verifier) with two tiny Qwen2 models built by the code that
share the tiny tokenizer:

1. **Teacher** (`--teacher-hidden` 256, 4 layers: twice the student's width, ~4x its weights): SFT on
   `--teacher-sft-examples` worked examples (the demo's 512) for `--teacher-sft-epochs` (40, as the
   student) at batch `--teacher-sft-batch` and `--teacher-lr` (half the demo's, for twice the width),
   optionally `--teacher-more-epochs` more at batch 32, then `--teacher-grpo-steps` (80) of the demo's
   GRPO: trained longer than the student. Each stage is cached under `<work>/teacher-...` (a second run,
   or another seed, reuses it); its held-out accuracy is reported.
2. **Student**: the demo's model and SFT recipe for `--student-sft-epochs` (40, as
   benchmarks/time_to_accuracy.py's warm start: the demo's 160 take ~4x as long on this CPU), cached the
   same way; every arm of every seed starts from it.
3. **The race**, `--budget` training seconds per arm (the sum of the optimizer steps' wall times, as the
   demo's time-matched control counts them; start-up, checkpoints and evaluation not counted):
   - `distill`: on-policy distillation (`algorithm.distill_coef=1`, `distill_task_coef=0`): the student
     samples, the teacher scores every token, the advantage is minus the per-token reverse KL;
   - `grpo`: the demo's GRPO on the task reward;
   - `sft_teacher`: off-policy distillation: the teacher's greedy answers to `--sft-prompts` training prompts
     written as an SFT set, then SFT of the student on it. The sampling time counts against the budget
     (the arm's clock starts at it), and the training runs in `--sft-chunks` pieces (each from the last
     one's export, a fresh optimizer each) so that it can be scored along the way.
   The RL arms are scored by the trainer's greedy validation every `--eval-every` steps, and at the budget
   by `quartet.demo.pipeline.greedy_accuracy` on the exported checkpoint (the same held-out problems).

The held-out problems (`data.seed`, `sft.seed` of the sets) are those of seed 0 for every seed, the ones the
teacher never trained on; a seed changes the sampling and the SFT batch order. Writes
`benchmarks/results/distillation.json` and `docs/images/distillation_race.png` (accuracy vs training
seconds per arm and seed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, table, write_result

from quartet.trainer.records.callbacks import RunCallbacks

RUNS = Path(__file__).resolve().parents[1] / "runs" / "distillation"
IMAGES = Path(__file__).resolve().parents[1] / "docs" / "images"
ARMS = ("distill", "grpo", "sft_teacher")
VAL_PREFIX = "val-core/"
BASE = [
    "cluster.backend=local",
    "trainer.loggers=[jsonl]",
    "trainer.rollout_freq=0",
    "trainer.resume=off",
    "data.seed=0",  # one held-out set for every seed and for the teacher (module docstring)
]


class StopAtSeconds(RunCallbacks):
    """Stop an RL run once its steps' wall times add up to `budget` seconds; keep (step, cumulative
    seconds) of each step, (step, accuracy) of each validation and each step's `distill/reverse_kl`."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.spent = 0.0
        self.seconds_at: dict[int, float] = {0: 0.0}
        self.evals: list[tuple[int, float]] = []
        self.reverse_kl: list[float] = []

    def on_record(self, record: dict[str, Any]) -> None:
        if record.get("kind") == "step":
            self.spent += float(record["timing_s/step"])
            self.seconds_at[int(record["step"])] = self.spent
            if "distill/reverse_kl" in record:
                self.reverse_kl.append(float(record["distill/reverse_kl"]))
        elif record.get("kind") == "val":
            self.evals.append((int(record["step"]), val_accuracy(record)))

    def should_stop(self, step: int, steps_this_process: int) -> bool:
        return self.spent >= self.budget


def val_accuracy(record: dict[str, Any]) -> float:
    """The greedy held-out accuracy of a trainer validation record (the verifier's mean reward)."""
    keys = [k for k in record if k.startswith(VAL_PREFIX) and "/reward/mean@" in k]
    if len(keys) != 1:
        raise ValueError(f"a validation record with one reward mean expected, found {keys}: {record}")
    return float(record[keys[0]])


def config(overrides: list[str], seed: int) -> Any:
    """The demo's config with the benchmark's base settings, the seed, then `overrides`."""
    from quartet.demo.pipeline import demo_config

    return demo_config([*BASE, f"sft.seed={seed}", *overrides], seed, quick=False)


def sft_model(folder: Path, overrides: list[str], seed: int) -> tuple[str, float]:
    """An SFT run (the demo's worked examples unless `overrides` set files) into `folder`: (model dir, s)."""
    from quartet.sft import SFTTrainer

    cfg = config([f"trainer.output_dir={folder}", "trainer.experiment_name=sft", *overrides], seed)
    result = SFTTrainer(cfg).run()
    return str(result.hf_dir), result.train_seconds


def rl_run(folder: Path, model_dir: str, overrides: list[str], seed: int, budget: float) -> dict[str, Any]:
    """GRPO (or distillation, by `overrides`) from `model_dir` for `budget` training seconds (or the
    steps `overrides` ask for, when `budget` is 0); the exported final policy and the curve."""
    from quartet.trainer import RLTrainer
    from quartet.trainer.recovery.export import export_checkpoint

    cfg = config(
        [
            f"trainer.output_dir={folder}",
            "trainer.experiment_name=rl",
            f"model.path={model_dir}",
            "trainer.val_before_train=false",
            *(["trainer.total_steps=1000000"] if budget else []),
            *overrides,
        ],
        seed,
    )
    stop = StopAtSeconds(budget if budget else float("inf"))
    result = RLTrainer(cfg, callbacks=stop).run()
    if result.preempted is not None:  # a signal, not the budget, stopped it: nothing to score or cache
        raise RuntimeError(f"the run in {folder} was stopped by a signal at step {result.steps}")
    if result.hf_dir is not None:
        hf_dir = str(result.hf_dir)
    else:  # stopped by the budget: its last step's checkpoint
        hf_dir = str(export_checkpoint(result.run_dir, folder / "final_hf"))
    curve = [{"seconds": stop.seconds_at[s], "step": s, "accuracy": a} for s, a in stop.evals]
    out = {"hf_dir": hf_dir, "steps": result.steps, "train_seconds": stop.spent, "curve": curve}
    return out | {"reverse_kl": stop.reverse_kl}


def accuracy(model_dir: str, val_file: str) -> float:
    """Greedy held-out accuracy of `model_dir` (`quartet.demo.pipeline.greedy_accuracy`)."""
    from quartet.demo.pipeline import greedy_accuracy

    correct, total = greedy_accuracy(config([], 0), model_dir, val_file)
    return correct / total


def task_files(folder: Path) -> tuple[str, str]:
    """The demo's RL prompt files (train, held-out) for data seed 0, written under `folder`."""
    from quartet.config.data import BuiltinTask
    from quartet.tasks import ArithmeticSpec, write_builtin

    cfg = config([], 0)
    ops = tuple(op.symbol for op in cfg.data.builtin_operations)
    spec = ArithmeticSpec(digits=cfg.data.builtin_digits, operations=ops)
    train, val = write_builtin(
        BuiltinTask.ARITHMETIC,
        folder,
        cfg.data.builtin_train_size,
        cfg.data.builtin_val_size,
        cfg.data.seed,
        spec=spec,
    )
    return str(train), str(val)


def cached(path: Path, build: Any) -> dict[str, Any]:
    """`path`'s JSON when it is there, else `build()`'s dict written to it."""
    if path.exists():
        return dict(json.loads(path.read_text()))
    value = dict(build())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
    return value


def build_teacher(work: Path, args: argparse.Namespace, val_file: str) -> dict[str, Any]:
    """The teacher (module docstring, 1.), each stage cached under `work`: SFT on
    `--teacher-sft-examples` worked examples at batch `--teacher-sft-batch`, more SFT on them at the demo's
    batch (`--teacher-more-epochs`), then `--teacher-grpo-steps` of GRPO (the demo's settings)."""
    hidden = args.teacher_hidden
    tiny = (
        f"model.tiny={{hidden_size: {hidden}, num_hidden_layers: 4, num_attention_heads: 4, "
        f"num_key_value_heads: 2, intermediate_size: {4 * hidden}, seed: 0}}"
    )
    examples = f"sft.builtin.train_size={args.teacher_sft_examples}"
    sizes = f"n{args.teacher_sft_examples}-b{args.teacher_sft_batch}-lr{args.teacher_lr:g}"
    sizes += f"-sft{args.teacher_sft_epochs}"
    base = work / f"teacher-h{hidden}-{sizes}"
    folder = base / f"more{args.teacher_more_epochs}-grpo{args.teacher_grpo_steps}"

    def first() -> dict[str, Any]:
        batch = args.teacher_sft_batch
        sizes = [tiny, examples, f"sft.epochs={args.teacher_sft_epochs}", f"sft.batch_size={batch}"]
        sizes += [f"sft.micro_batch_size_per_device={batch}", f"sft.optim.lr={args.teacher_lr}"]
        sft_dir, sft_s = sft_model(base, sizes, 0)
        return {"model_dir": sft_dir, "seconds": sft_s, "accuracy": accuracy(sft_dir, val_file)}

    def build() -> dict[str, Any]:
        stage1 = cached(base / "sft1.json", first)
        out = {"folder": str(folder), "tiny": tiny, "sft1": stage1, "model_dir": stage1["model_dir"]}
        if args.teacher_more_epochs:
            more = [
                tiny,
                examples,
                f"model.path={stage1['model_dir']}",
                f"sft.epochs={args.teacher_more_epochs}",
            ]
            sft_dir, sft_s = sft_model(folder / "more", more, 0)
            out |= {"model_dir": sft_dir, "sft2": {"seconds": sft_s, "accuracy": accuracy(sft_dir, val_file)}}
        if args.teacher_grpo_steps:
            steps = [tiny, f"trainer.total_steps={args.teacher_grpo_steps}", "trainer.test_freq=0"]
            rl = rl_run(folder, out["model_dir"], steps, 0, 0.0)
            out |= {"model_dir": rl["hf_dir"], "grpo": {"seconds": rl["train_seconds"], "steps": rl["steps"]}}
        out["accuracy"] = accuracy(out["model_dir"], val_file)
        return out

    return cached(folder / "teacher.json", build)


def build_student(work: Path, args: argparse.Namespace, val_file: str) -> dict[str, Any]:
    """The student's SFT start: the demo's model and worked examples (module docstring, 2.), cached."""
    folder = work / f"student-sft{args.student_sft_epochs}"

    def build() -> dict[str, Any]:
        model_dir, secs = sft_model(folder, [f"sft.epochs={args.student_sft_epochs}", "model.tiny.seed=0"], 0)
        return {"model_dir": model_dir, "sft_seconds": secs, "accuracy": accuracy(model_dir, val_file)}

    return cached(folder / "student.json", build)


def teacher_set(work: Path, teacher_dir: str, train_file: str, prompts: int) -> dict[str, Any]:
    """The teacher's greedy answers to the first `prompts` training prompts as an SFT parquet (the
    prompt's messages, then the answer as the assistant's), and the seconds sampling took."""
    from quartet.data.prompts import PromptDataset
    from quartet.models.loading import load_tokenizer
    from quartet.rollout import SamplingParams, TorchRolloutEngine, requests_from_batch
    from quartet.tasks.rows import sft_row, write_parquet

    cfg = config([], 0)
    tokenizer = load_tokenizer(teacher_dir)
    data = PromptDataset.from_files([train_file], cfg.data, tokenizer)
    if len(data) < prompts:
        raise ValueError(
            f"--sft-prompts {prompts} is more than the {len(data)} training prompts of {train_file}"
        )
    batch = data.batch(list(range(prompts)))
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.data.max_response_length)
    start = time.perf_counter()
    with TorchRolloutEngine.from_pretrained(teacher_dir, max_num_seqs=cfg.rollout.max_num_seqs) as engine:
        outputs = engine.generate(requests_from_batch(batch, params))
    seconds = time.perf_counter() - start
    rows = []
    for i, outs in enumerate(outputs):
        answer = str(tokenizer.decode(list(outs[0].token_ids), skip_special_tokens=True)).strip()
        messages = [*batch.non_tensors["raw_prompt"][i], {"role": "assistant", "content": answer}]
        rows.append(
            sft_row(messages, batch.non_tensors["ground_truth"][i], batch.non_tensors["data_source"][i])
        )
    path = write_parquet(rows, work / f"teacher_sft{prompts}.parquet")
    return {"file": str(path), "rows": len(rows), "sample_seconds": seconds}


def sft_arm(
    folder: Path, start_dir: str, data: dict[str, Any], args: argparse.Namespace, seed: int, val_file: str
) -> dict[str, Any]:
    """SFT on the teacher's answers for the budget less the sampling time, in `--sft-chunks` pieces."""
    left = max(args.budget - data["sample_seconds"], 0.0)
    model_dir, spent = start_dir, data["sample_seconds"]
    curve = []
    for k in range(args.sft_chunks):
        piece = left / args.sft_chunks
        overrides = [
            f"sft.train_files=[{data['file']}]",
            f"model.path={model_dir}",
            f"sft.max_seconds={piece}",
            "sft.epochs=100000",
            f"sft.seed={seed * 100 + k}",
        ]
        model_dir, secs = sft_model(folder / f"chunk{k}", overrides, seed)
        spent += secs
        curve.append({"seconds": spent, "step": k + 1, "accuracy": accuracy(model_dir, val_file)})
    return {"hf_dir": model_dir, "train_seconds": spent, "curve": curve}


def race_seed(work: Path, seed: int, args: argparse.Namespace, parts: dict[str, Any]) -> dict[str, Any]:
    """The three arms of one seed from the student's start; each arm's curve and its final accuracy."""
    start, val_file = parts["student"]["model_dir"], parts["val_file"]
    eval_every = [f"trainer.test_freq={args.eval_every}", *args.override]
    distill = [
        f"teacher.model_path={parts['teacher']['model_dir']}",
        "algorithm.distill_coef=1.0",
        "algorithm.distill_task_coef=0.0",
    ]
    out: dict[str, Any] = {}
    for arm in ARMS:
        t0 = time.perf_counter()
        folder = work / f"seed{seed}" / arm
        shutil.rmtree(folder, ignore_errors=True)  # an earlier run's checkpoints must not be scored
        if arm == "sft_teacher":
            run = sft_arm(folder, start, parts["teacher_set"], args, seed, val_file)
        else:
            run = rl_run(folder, start, eval_every + (distill if arm == "distill" else []), seed, args.budget)
            run["curve"].append(
                {
                    "seconds": run["train_seconds"],
                    "step": run["steps"],
                    "accuracy": accuracy(run["hf_dir"], val_file),
                }
            )
        run["final_accuracy"] = run["curve"][-1]["accuracy"]
        run["curve"].insert(0, {"seconds": 0.0, "step": 0, "accuracy": parts["student"]["accuracy"]})
        run["wall_s"] = time.perf_counter() - t0
        out[arm] = run
        print(
            f"seed {seed} {arm}: {run['final_accuracy']:.1%} after {run['train_seconds']:.1f} s", flush=True
        )
    return out


def plot(seeds: list[dict[str, Any]], teacher: float, png: Path) -> str | None:
    """Held-out accuracy vs training seconds, one line per arm and seed; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"distill": "tab:blue", "grpo": "tab:orange", "sft_teacher": "tab:green"}
    for i, seed in enumerate(seeds):
        for arm in ARMS:
            c = seed["arms"][arm]["curve"]
            ax.plot([p["seconds"] for p in c], [p["accuracy"] for p in c], "o-", color=colors[arm],
                    alpha=0.8, label=arm if i == 0 else None)  # fmt: skip
    ax.axhline(teacher, color="black", ls="--", label="teacher")
    ax.set_xlabel("training seconds (CPU)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("Student (demo model) distilled vs GRPO vs SFT on teacher samples")
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return str(png)


def summarise(seeds: list[dict[str, Any]], parts: dict[str, Any]) -> dict[str, Any]:
    """Per arm: the final accuracies, their mean, and the mean seconds spent; the teacher and the start."""
    summary: dict[str, Any] = {
        "teacher_accuracy": parts["teacher"]["accuracy"],
        "student_start_accuracy": parts["student"]["accuracy"],
    }
    for arm in ARMS:
        finals = [s["arms"][arm]["final_accuracy"] for s in seeds]
        summary[arm] = {
            "final_accuracy": finals,
            "mean": statistics.fmean(finals),
            "train_seconds_mean": statistics.fmean(s["arms"][arm]["train_seconds"] for s in seeds),
        }
    return summary


SMOKE = {
    "seeds": "0",
    "budget": 4.0,
    "eval_every": 2,
    "sft_chunks": 2,
    "sft_prompts": 64,
    "teacher_hidden": 64,
    "teacher_sft_epochs": 2,
    "teacher_grpo_steps": 2,
    "student_sft_epochs": 1,
    "teacher_sft_examples": 64,
    "teacher_more_epochs": 1,
}
"""`--smoke`'s sizes (the pipeline, not the figures), over the parsed flags."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--budget", type=float, default=20.0, help="training seconds per arm")
    parser.add_argument("--eval-every", type=int, default=5, help="RL arms: validate every this many steps")
    parser.add_argument("--sft-chunks", type=int, default=2)
    parser.add_argument("--sft-prompts", type=int, default=2048)
    parser.add_argument("--teacher-hidden", type=int, default=256)
    parser.add_argument("--teacher-sft-examples", type=int, default=512, help="worked examples (demo: 512)")
    parser.add_argument("--teacher-sft-epochs", type=int, default=40)
    parser.add_argument("--teacher-lr", type=float, default=5e-4, help="first SFT stage (demo: 1e-3)")
    parser.add_argument("--teacher-sft-batch", type=int, default=32, help="SFT batch (demo: 32)")
    parser.add_argument("--teacher-more-epochs", type=int, default=0, help="then SFT at batch 32")
    parser.add_argument("--teacher-grpo-steps", type=int, default=80)
    parser.add_argument("--student-sft-epochs", type=int, default=40)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="both RL arms")
    parser.add_argument(
        "--prepare-only", action="store_true", help="build the teacher and the start, then stop"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: the pipeline, not the figures")
    parser.add_argument(
        "--work", type=Path, default=None, help="models and runs (default <out>/distillation_work)"
    )
    parser.add_argument("--out-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.smoke:
        for name, value in SMOKE.items():
            setattr(args, name, value)
        args.override = [
            *args.override,
            "data.train_batch_size=8",
            "rollout.n=4",
            "actor.mini_batch_size=8",
            "actor.micro_batch_size_per_device=32",
        ]
    out_dir = args.out_dir or RESULTS_DIR
    # the cache of models and runs: beside a given result folder, else in the ignored runs/ of the checkout
    work = args.work or (out_dir / "distillation_work" if args.out_dir else RUNS)
    train_file, val_file = task_files(work / "data")
    parts: dict[str, Any] = {"val_file": val_file}
    parts["teacher"] = build_teacher(work, args, val_file)
    parts["student"] = build_student(work, args, val_file)
    print(
        f"teacher {parts['teacher']['accuracy']:.1%}, student start {parts['student']['accuracy']:.1%}",
        flush=True,
    )
    folder = Path(parts["teacher"]["folder"])  # the teacher's samples are cached with it
    parts["teacher_set"] = cached(
        folder / f"teacher_set{args.sft_prompts}.json",
        lambda: teacher_set(folder, parts["teacher"]["model_dir"], train_file, args.sft_prompts),
    )
    if args.prepare_only:
        return
    seeds = []
    for seed in map(int, args.seeds.split(",")):
        seeds.append({"seed": seed, "arms": race_seed(work, seed, args, parts)})
    summary = summarise(seeds, parts)
    # the docs' figure for a full run; beside the result for a run with --out-dir
    png_path = out_dir / "distillation.png" if args.out_dir else IMAGES / "distillation_race.png"
    png = plot(seeds, parts["teacher"]["accuracy"], png_path)
    rows = [[arm, *(f"{a:.1%}" for a in summary[arm]["final_accuracy"]), f"{summary[arm]['mean']:.1%}",
             summary[arm]["train_seconds_mean"]] for arm in ARMS]  # fmt: skip
    print(table(["arm", *(f"seed {s['seed']}" for s in seeds), "mean", "train s"], rows))
    settings = {k: v for k, v in vars(args).items() if k not in ("work", "out_dir")}
    raw = {"teacher": parts["teacher"], "student": parts["student"], "teacher_set": parts["teacher_set"]}
    raw |= {"seeds": seeds, "plot": png}
    print(f"wrote {write_result('distillation', settings, raw, summary, args.out_dir)}")


if __name__ == "__main__":
    main()
