"""GRPO runs for the benchmarks: the same model folder, prompt files and settings, run by `quartet train` or
by TRL's `GRPOTrainer` (in its own venv), each in a fresh process; per-step times and evaluations back.

`prepare(workdir, size)` saves a model of one of `SIZES` (tokenizer trained here, random weights, saved once
and read by both sides through `from_pretrained`) and the arithmetic task's prompt files (verl's parquet
layout: quartet reads them as they are, TRL's runner maps them to conversational prompts).
`GrpoSettings` holds what both sides share; `run_quartet` / `run_trl` return a `RunResult`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUARTET = Path(sys.executable).parent / "quartet"
TRL_RUNNER = Path(__file__).resolve().parent / "peers" / "trl_grpo.py"

SIZES: dict[str, dict[str, int]] = {
    # hidden, layers, heads, kv heads, MLP width; the vocabulary is the tokenizer's (512 tokens)
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 256},
    "20M": {"hidden_size": 512, "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4,
            "intermediate_size": 1536},
    "demo": {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 512},
}  # fmt: skip


SMOKE_OVERRIDES = ("cluster.backend=local",)
"""What a benchmark's `--smoke` adds to quartet's side: the roles in the driver, no Ray to start (~20 s a
process). A smoke checks the benchmark's pipeline; Ray's path is what the timed runs and the suite cover."""


@dataclass(frozen=True)
class GrpoSettings:
    """What both sides run: one generation and one optimizer step per step, fp32 or bf16, no KL term."""

    steps: int = 6
    prompts_per_step: int = 16
    n: int = 4
    max_prompt_length: int = 32
    max_new_tokens: int = 32
    temperature: float = 1.0
    lr: float = 1e-5
    dtype: str = "float32"
    seed: int = 0
    threads: int = 1
    eval_every: int = 0
    eval_size: int = 200
    target_accuracy: float | None = None
    quartet_overrides: tuple[str, ...] = ()
    """Extra `key=value` config overrides for quartet's side only (before/after comparisons)."""
    device: str = "cpu"
    """Where TRL's side trains (`cuda` on a GPU: benchmarks/gpu/goal_train.py); quartet's side follows its
    `cluster.device` (auto: the GPU where there is one)."""


@dataclass
class RunResult:
    """One process's run: per-step wall seconds and what else it measured."""

    side: str
    step_seconds: list[float]
    phase_seconds: dict[str, list[float]] = field(default_factory=dict)
    response_length_mean: list[float] = field(default_factory=list)
    startup_seconds: float = 0.0
    """Process seconds outside the timed steps: imports, start-up, model loading, evaluations, shutdown."""
    process_seconds: float = 0.0
    evals: list[dict[str, float]] = field(default_factory=list)
    params: int = 0


@dataclass(frozen=True)
class Workdir:
    model_dir: Path
    train_parquet: Path
    val_parquet: Path
    params: int


def prepare(workdir: Path, size: str, train_size: int = 4096, val_size: int = 200, seed: int = 0) -> Workdir:
    """Save the model of `size` and the 2-digit addition prompt files under `workdir` (once)."""
    from quartet.config.model import TinyModelConfig
    from quartet.models.tiny import save_tiny_model
    from quartet.tasks.arithmetic import ArithmeticSpec, write_rl_set

    model_dir = workdir / f"model-{size}"
    if not (model_dir / "config.json").exists():
        save_tiny_model(model_dir, TinyModelConfig(seed=seed, **SIZES[size]))
    data = workdir / "data"
    if not (data / "rl_train.parquet").exists():
        write_rl_set(data, ArithmeticSpec(digits=2, operations=("+",)), train_size, val_size, seed)
    return Workdir(model_dir, data / "rl_train.parquet", data / "rl_val.parquet", count_params(model_dir))


def count_params(model_dir: Path) -> int:
    """Parameters of the saved model (tied embeddings counted once), from its safetensors headers."""
    from safetensors import safe_open

    total = 0
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has keys(), no iteration)
                shape = f.get_slice(name).get_shape()
                n = 1
                for d in shape:
                    n *= int(d)
                total += n
    return total


def quartet_config(w: Workdir, s: GrpoSettings, out_dir: Path, name: str) -> dict[str, Any]:
    """The `quartet train` config of these settings (written next to the run, so it can be rerun)."""
    rows = s.prompts_per_step * s.n
    evaluating = s.eval_every > 0
    return {
        # packed micro-batches (verl's GRPO recipes set use_remove_padding), with each prompt once per group
        "model": {"path": str(w.model_dir), "remove_padding": True},
        "data": {
            "train_files": [str(w.train_parquet)],
            "val_files": [str(w.val_parquet)],
            "max_prompt_length": s.max_prompt_length,
            "max_response_length": s.max_new_tokens,
            "train_batch_size": s.prompts_per_step,
            "val_batch_size": s.eval_size,
            "seed": s.seed,
        },
        "algorithm": {"adv_estimator": "grpo"},
        "rollout": {
            "n": s.n,
            "temperature": s.temperature,
            "max_num_seqs": max(rows, s.eval_size),
            "seed": s.seed,
        },
        "actor": {
            "optim": {"lr": s.lr, "weight_decay": 0.0},
            "mini_batch_size": s.prompts_per_step,
            "micro_batch_size_per_device": rows,
            "mixed_precision": s.dtype,
            "logprobs": {"micro_batch_size_per_device": rows},
        },
        "cluster": {"cpus_per_bundle": s.threads},
        "trainer": {
            "project_name": "bench",
            "experiment_name": name,
            "output_dir": str(out_dir),
            "total_steps": s.steps,
            "test_freq": s.eval_every,
            "val_before_train": evaluating,
            "save_freq": 0,
            "export_final": False,
            "resume": "off",
            "loggers": ["jsonl"],
            "seed": s.seed,
        },
    }


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env |= {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    env["RAY_DEDUP_LOGS"] = "0"
    return env


def run_quartet(w: Workdir, s: GrpoSettings, out_dir: Path, name: str, timeout_s: float = 1800) -> RunResult:
    """`quartet train` in a fresh process; per-step figures from its `metrics.jsonl`."""
    import time

    import yaml

    out_dir.mkdir(parents=True, exist_ok=True)
    config = out_dir / f"{name}.yaml"
    config.write_text(yaml.safe_dump(quartet_config(w, s, out_dir, name), sort_keys=False))
    start = time.perf_counter()
    proc = subprocess.run(
        [str(QUARTET), "train", str(config), *s.quartet_overrides],
        env=_env(s.threads),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"quartet train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    records = [
        json.loads(line) for line in (out_dir / "bench" / name / "metrics.jsonl").read_text().splitlines()
    ]
    steps = [r for r in records if r.get("kind") == "step"]
    phases: dict[str, list[float]] = {}
    for r in steps:
        for key, value in r.items():
            if key.startswith("timing_s/") and key != "timing_s/step":
                phases.setdefault(key.removeprefix("timing_s/"), []).append(float(value))
    train_total = 0.0
    by_step = {int(r["step"]): float(r["timing_s/step"]) for r in steps}
    evals = []
    for r in records:
        if r.get("kind") == "val":
            step = int(r["step"])
            train_total = sum(v for k, v in by_step.items() if k <= step)
            acc = next(v for k, v in r.items() if k.startswith("val-core/") and "/reward/mean@" in k)
            evals.append({"step": step, "train_seconds": train_total, "accuracy": float(acc)})
    return RunResult(
        side="quartet",
        step_seconds=[float(r["timing_s/step"]) for r in steps],
        phase_seconds=phases,
        response_length_mean=[float(r.get("response_length/mean", float("nan"))) for r in steps],
        startup_seconds=seconds - sum(by_step.values()),
        process_seconds=seconds,
        evals=evals,
        params=w.params,
    )


def run_trl(
    python: Path, w: Workdir, s: GrpoSettings, out_dir: Path, name: str, timeout_s: float = 1800
) -> RunResult:
    """TRL's `GRPOTrainer` (benchmarks/peers/trl_grpo.py) in a fresh process of the TRL venv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = dataclasses.asdict(s) | {
        "model_dir": str(w.model_dir),
        "train_parquet": str(w.train_parquet),
        "val_parquet": str(w.val_parquet),
    }
    settings_file, result_file = out_dir / f"{name}.settings.json", out_dir / f"{name}.json"
    settings_file.write_text(json.dumps(settings, indent=2))
    proc = subprocess.run(
        [str(python), str(TRL_RUNNER), str(settings_file), str(result_file)],
        env=_env(s.threads),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=out_dir,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"TRL run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    out = json.loads(result_file.read_text())
    return RunResult(
        side="trl",
        step_seconds=out["step_seconds"],
        response_length_mean=out["completion_mean_length"],
        startup_seconds=out["startup_seconds"],
        process_seconds=out["process_seconds"],
        evals=out["evals"],
        params=int(out["params"]),
    )
