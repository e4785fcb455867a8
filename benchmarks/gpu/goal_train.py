"""Steps c, d and f of issue 37's GPU script: whole `quartet train` runs (through a local Ray on a GPU).

c. first_step: time to the first step of the single-GPU example at the Qwen2-1.5B shape (no offload,
   512-token responses: the issue's goal, 25 s), broken into the trainer's own `startup` phases (imports,
   prepare, workers, first step); first_step_example, the script's last step: the example as it is (~0.36B,
   offload on). The model folders are built beforehand (a user brings one), with quartet's tiny tokenizer.
d. async_vs_sync: `examples/single_gpu/sync.yaml` and `async.yaml` (the actor and a rollout pool on halves of
   the one GPU) for a few steps each; the figure is the time a step takes once running (the spacing of the
   step records after the first).
f. trl: TRL's GRPOTrainer and quartet on the same model, prompt files, lengths and batch
   (`benchmarks/grpo_runs.py`), step time each, where TRL is importable.

A run is stopped (its process group) once it has written the steps asked for: the checkpoint every run
writes at its end is not what is measured. In a dry run everything is tiny, on the CPU, on the local backend.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from goal_io import ROOT, Step, child_env, log, quartet_command

QWEN_0_36B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  intermediate_size=4864)  # fmt: skip
QWEN_1_5B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960)  # fmt: skip
TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128)  # fmt: skip
DRY_QUARTET = ("cluster.backend=local", "cluster.device=cpu")
EXAMPLES = ROOT / "examples" / "single_gpu"
DRY_SIZES = (
    "data.max_response_length=8", "data.train_batch_size=2", "rollout.n=2", "rollout.max_num_seqs=4",
    "actor.mini_batch_size=2", "actor.micro_batch_size_per_device=4",
    "actor.logprobs.micro_batch_size_per_device=4",
    "data.builtin_train_size=64", "data.builtin_val_size=4", "data.val_batch_size=4",
)  # fmt: skip


def model_folder(step: Step, shape: dict[str, int], name: str) -> Path:
    """A random model of `shape` with quartet's tiny tokenizer, built on the device, saved in bf16 on GPU."""
    import torch
    from torch import nn

    from quartet.config.model import TinyModelConfig
    from quartet.models.tiny import build_tiny_causal_lm, build_tiny_tokenizer

    folder = step.work / name
    if (folder / "config.json").exists():
        return folder
    sizes: dict[str, Any] = TINY if step.dry_run else shape
    spec = TinyModelConfig(**sizes, max_position_embeddings=1024)
    tokenizer = build_tiny_tokenizer(spec.vocab_size, spec.seed)
    with torch.device(step.device):
        model = build_tiny_causal_lm(spec, tokenizer)
    if step.cuda:
        nn.Module.to(model, dtype=torch.bfloat16)
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)
    del model
    return folder


def run_overrides(step: Step, name: str, steps: int, dry_run: bool) -> list[str]:
    """What every timed run adds: its own folder, `steps` steps, no validation, JSONL only, a local Ray."""
    common = [
        f"trainer.output_dir={step.work / 'runs'}", "trainer.project_name=goals",
        f"trainer.experiment_name={name}",
        f"trainer.total_steps={steps}", "trainer.test_freq=0", "trainer.val_before_train=false",
        "trainer.save_freq=0", "trainer.export_final=false", "trainer.loggers=[jsonl]", "trainer.resume=off",
    ]  # fmt: skip
    if dry_run:
        return [*common, "cluster.backend=local", "cluster.device=cpu", *DRY_SIZES]
    return [*common, "cluster.address=local"]


def config_loads(step: Step, config: Path, overrides: list[str], name: str) -> dict[str, Any]:
    """A dry run's stand-in for a run it does not train: the GPU run's config and overrides load."""
    from quartet.config import load_config

    load_config(config, [*overrides, *run_overrides(step, name, 2, dry_run=False)])
    return {
        "status": "pass",
        "dry_run": "the GPU run's config loads (a dry run trains first_step's run only)",
    }


def train(step: Step, config: Path, overrides: list[str], name: str, steps: int) -> dict[str, Any]:
    """`quartet train` in its own process group until it has recorded `steps` steps (or the deadline)."""
    metrics = step.work / "runs" / "goals" / name / "metrics.jsonl"
    cmd = [
        *quartet_command(),
        "train",
        str(config),
        *overrides,
        *run_overrides(step, name, steps, step.dry_run),
    ]
    logfile = step.work / f"{name}.log"
    spawn = time.time()
    with logfile.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(),
                                start_new_session=True, cwd=step.work)  # fmt: skip
        try:  # stopped with 25 s left: the group's end and this step's record fit before the deadline
            while proc.poll() is None and step.left() > 25:
                if sum(r.get("kind") == "step" for r in _records(metrics)) >= steps:
                    break
                time.sleep(1.0)
        finally:  # also when this process is told to end (SIGTERM: see goals.step_main)
            _stop(proc)
    records = _records(metrics)
    result = summarize(records, spawn)
    result["process_s"] = round(time.time() - spawn, 2)
    if result["steps"] < steps:
        result["status"] = "fail"
        result["reason"] = f"{result['steps']}/{steps} steps; log tail: " + logfile.read_text()[-2500:]
    return result


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            break
    return out


def _stop(proc: subprocess.Popen[Any]) -> None:
    """End the run and everything it started (Ray's processes share its group), politely first."""
    for sig, wait in ((signal.SIGTERM, 8), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def summarize(records: list[dict[str, Any]], spawn: float) -> dict[str, Any]:
    """Step times, phase times of the last step, the startup record's phases and the steady step spacing."""
    steps = [r for r in records if r.get("kind") == "step"]
    startup = next((r for r in records if r.get("kind") == "startup"), {})
    result: dict[str, Any] = {
        "steps": len(steps),
        "step_s": [round(float(r["timing_s/step"]), 3) for r in steps],
        "startup": {k: round(float(v), 3) for k, v in startup.items() if k.endswith("_s")},
    }
    if steps:
        last = steps[-1].items()
        result["last_step_phases_s"] = {
            k.removeprefix("timing_s/"): round(float(v), 3) for k, v in last if k.startswith("timing_s/")
        }
        result["spawn_to_first_step_end_s"] = round(float(steps[0]["time"]) - spawn, 2)
    if len(steps) >= 2:
        times = [float(r["time"]) for r in steps]
        result["steady_step_s"] = round((times[-1] - times[0]) / (len(times) - 1), 3)
    return result


def first_step(step: Step) -> None:
    """c: the single-GPU example at the 1.5B shape, no offload, 512-token responses (the goal: 25 s)."""
    extra = ["actor.param_offload=false", "actor.optimizer_offload=false", "reference.param_offload=false",
             "data.max_response_length=512"]  # fmt: skip
    _first_step_case(step, "1.5B", QWEN_1_5B, extra, 90.0, trains=True)


def first_step_example(step: Step) -> None:
    """c, continued: the example as it is (0.36B, offload on); last, since no goal reads it."""
    _first_step_case(step, "0.36B", QWEN_0_36B, [], 70.0, trains=not step.dry_run)


def _first_step_case(
    step: Step, name: str, shape: dict[str, int], extra: list[str], estimate: float, trains: bool
) -> None:
    """One run of the example to its first step (one step: the `startup` record comes with it)."""
    config, key = EXAMPLES / "config.yaml", f"example_{name}"
    if not step.fits(key, estimate):
        return
    try:
        if not trains:  # a dry run trains one case only
            step.put(key, config_loads(step, config, [f"model.path={step.work}", *extra], key))
            return
        folder = model_folder(step, shape, f"model-{name}")
        step.put(key, train(step, config, [f"model.path={folder}", *extra], key, 1) | {"overrides": extra})
    except Exception as err:
        step.put(key, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
    log(f"{key}: done")


def async_vs_sync(step: Step) -> None:
    """d: sync.yaml then async.yaml (or async.yaml with trainer.mode=sync as the baseline), N steps each."""
    sync_cfg, async_cfg = EXAMPLES / "sync.yaml", EXAMPLES / "async.yaml"
    if not async_cfg.exists():
        step.put("status", "skip")
        step.put("reason", "examples/single_gpu/async.yaml is not in this tree (the fractional-GPU work)")
        return
    n = 4
    baseline = (sync_cfg, []) if sync_cfg.exists() else (async_cfg, ["trainer.mode=sync"])
    modes = [("sync", *baseline), ("async", async_cfg, [])]
    for mode, config, extra in modes:
        if not step.fits(mode, 60.0):  # a run cut at the deadline keeps its steady figure from 2 steps
            continue
        try:
            if step.dry_run:  # async needs Ray's separate pools, and CI has its own sync run: configs only
                step.put(mode, config_loads(step, config, extra, f"mode_{mode}"))
                continue
            step.put(mode, train(step, config, extra, f"mode_{mode}", n) | {"config": config.name})
        except Exception as err:
            step.put(mode, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:2000]})
    sync_s, async_s = (step.record.get(m, {}).get("steady_step_s") for m in ("sync", "async"))
    if sync_s and async_s:
        step.put("async_speedup", round(sync_s / async_s, 3))
        _compare_modes(step)
    log("async_vs_sync: done")


def _compare_modes(step: Step) -> None:
    """The fractional-GPU work's own comparison of the two runs (`compare_modes.py`, where it exists):
    medians after the pipeline fills, samples/s, overlap and staleness."""
    if not (Path(__file__).parent / "compare_modes.py").exists():
        return
    try:
        import compare_modes  # type: ignore[import-not-found,unused-ignore]

        runs = [step.work / "runs" / "goals" / f"mode_{m}" for m in ("sync", "async")]
        step.put("compare_modes", compare_modes.compare(runs, skip=2))
    except Exception as err:  # an extra view: the step's own figures stand without it
        step.put("compare_modes", {"status": "fail", "reason": f"{type(err).__name__}: {err}"[:1000]})


def trl_side_by_side(step: Step) -> None:
    """f: the same GRPO steps by quartet and by TRL's GRPOTrainer (benchmarks/grpo_runs.py) on this device."""
    try:
        import trl  # noqa: F401
    except ImportError as err:
        step.put("status", "skip")
        step.put("reason", f"TRL is not importable here ({err}): make_wheels.sh carries it for the device")
        return
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import grpo_runs

    shim = step.work / "quartet"  # grpo_runs runs `quartet`: the console script is not installed here
    shim.write_text(f'#!/bin/sh\nexec {" ".join(quartet_command())} "$@"\n')
    shim.chmod(0o755)
    grpo_runs.QUARTET = shim
    folder = model_folder(step, QWEN_0_36B, "model-0.36B")
    data = grpo_runs.prepare(step.work / "trl", "tiny")  # the prompt files (and an unused tiny model)
    work = grpo_runs.Workdir(folder, data.train_parquet, data.val_parquet, grpo_runs.count_params(folder))
    tiny = step.dry_run
    # padded on the device until it has timed the packed path there: without flash-attn that path is one
    # SDPA call per row (or shared-prompt span) and layer, where the padded one is one call per layer
    overrides = (*(DRY_QUARTET if tiny else ("cluster.address=local",)), "model.remove_padding=false")
    settings = grpo_runs.GrpoSettings(
        steps=2 if tiny else 4, prompts_per_step=2 if tiny else 16, n=2 if tiny else 8,
        max_new_tokens=8 if tiny else 128, dtype="float32" if tiny else "bfloat16", threads=1 if tiny else 4,
        device=step.device,
        quartet_overrides=overrides,
    )  # fmt: skip
    python = Path(sys.executable)
    sides: dict[str, Callable[[], Any]] = {
        "quartet": lambda: grpo_runs.run_quartet(work, settings, step.work / "q", "quartet"),
        "trl": lambda: grpo_runs.run_trl(python, work, settings, step.work / "t", "trl"),
    }
    for side, fn in sides.items():
        if not step.fits(side, 90.0):
            continue
        try:
            res = fn()
            steady = round(statistics.median(res.step_seconds[1:]), 4) if len(res.step_seconds) > 1 else None
            step.put(side, {"step_s": [round(s, 3) for s in res.step_seconds], "steady_step_s": steady,
                            "startup_s": round(res.startup_seconds, 2), "params": res.params})  # fmt: skip
        except Exception as err:
            step.put(side, {"status": "fail", "reason": f"{type(err).__name__}: {err}"[-2000:]})
    ours, theirs = (step.record.get(s, {}).get("steady_step_s") for s in ("quartet", "trl"))
    if ours and theirs:
        step.put("quartet_speedup", round(theirs / ours, 3))
    log("trl: done")
