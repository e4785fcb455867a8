"""Issue 37's GPU figures from ONE run: every goal measured in order of value within a time budget.

    PYTHONPATH=src python benchmarks/gpu/goals.py --budget 480 --out DIR    # a CUDA machine (device_run.sh)
    .venv/bin/python benchmarks/gpu/goals.py --dry-run --out DIR            # CPU, tiny sizes, seconds (CI)

Steps, in order (each in its own process with its own deadline; in a dry run, in this one; `--only a,b`):
  decode         a. the built-in engine's decode at 0.5B and 7B, 64 and 256 rows, full vocabulary, against
                    the HBM roofline; the 7B/64 kernel profile
  fp8_decode     issue 54: the 7B decode with fp8 projections (rollout.quantization=fp8) at 64 and 256 rows
                    against the bf16 roofline; the scaled fp8 matmul against its float32 twin and bf16
  decode_kernels issue 54: the fused Triton kernels against their torch paths (7B shape, 64 and 256 rows),
                    and the engine's decode at 0.5B and 7B / 64 rows with `rollout.fused_kernels` off and auto
  hf_baseline    a. HF's static-cache generate (compiled by transformers) at 0.5B/64: the issue's baseline
  update         b. the actor update's MFU at the 1.5B shape (packed, no offload; fused head on and off,
                    and packed attention span by span instead of the varlen kernel)
  moe            issue 49: a Qwen3-MoE (hidden 1024, 12 layers, 64 experts, top 8): the experts' matmul that
                    ran (grouped where torch has one), decode tok/s at 64 rows, one update's time and memory
  first_step     c. `quartet train` of the single-GPU example at 1.5B to its first step, phase by phase
  async_vs_sync  d. sync.yaml against async.yaml on the one GPU (skipped where async.yaml is absent)
  hooks          e. fused_head.py, cuda_ipc_check.py, `quartet demo --device gpu`, where present
  trl            f. TRL's GRPOTrainer against quartet on the same model, prompts, lengths and batch
  first_step_example  c. the same for the example as it is (0.36B, offload): last, no goal reads it

A step starts only when the budget left covers its minimum; it may use 1.5 times its estimate (never past
the budget), and is killed at its deadline with what it measured kept: each step rewrites its part file after
every case. `DIR/goals.json` is rewritten after every step: the steps' records and a `goals` table (each
issue-37 goal, its figure, met or not). A step that fails records its error; the others still run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from goal_io import Step, child_env, log  # noqa: E402

STEPS: dict[str, tuple[str, float, float]] = {
    # name: (module:function, estimated seconds on an H200, the least worth starting with)
    "decode": ("goal_decode:run", 90.0, 50.0),
    "fp8_decode": ("goal_fp8:run", 70.0, 40.0),
    "decode_kernels": ("goal_decode_kernels:run", 90.0, 45.0),
    "hf_baseline": ("goal_decode:hf_baseline", 100.0, 60.0),
    "update": ("goal_update:run", 80.0, 45.0),
    "moe": ("goal_moe:run", 90.0, 50.0),
    "first_step": ("goal_train:first_step", 120.0, 90.0),
    "async_vs_sync": ("goal_train:async_vs_sync", 160.0, 110.0),
    "hooks": ("goal_hooks:run", 120.0, 40.0),
    "trl": ("goal_train:trl_side_by_side", 200.0, 90.0),
    "first_step_example": ("goal_train:first_step_example", 80.0, 70.0),
}


def run_step(name: str, work: Path, deadline: float, dry_run: bool = False) -> dict[str, Any]:
    """The step in a child process (killed, with its group, at the deadline); its part file is its result."""
    part = work / f"{name}.part.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--part", str(part),
           "--deadline", str(deadline), "--work", str(work / name)] + ["--dry-run"] * dry_run  # fmt: skip
    start = time.time()
    proc = subprocess.Popen(cmd, env=child_env(), start_new_session=True)
    try:
        code: int | None = proc.wait(timeout=max(deadline - time.time(), 1) + 10)
    except subprocess.TimeoutExpired:
        code = None
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=wait)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
    record: dict[str, Any] = json.loads(part.read_text()) if part.exists() else {}
    if code != 0 and "reason" not in record:
        record["reason"] = "killed at its deadline" if code is None else f"exit status {code}"
    return _finish(record, code == 0, start)


def _finish(record: dict[str, Any], ok: bool, start: float) -> dict[str, Any]:
    """The step's status: its own when it set one, else `fail` when it or one of its cases failed."""
    failed = [k for k, v in record.items() if isinstance(v, dict) and v.get("status") == "fail"]
    if failed and "reason" not in record:
        record["reason"] = f"failed: {', '.join(failed)}"
    record.setdefault("status", "pass" if ok and not failed else "fail")
    record["seconds"] = round(time.time() - start, 2)
    return record


def step_main(args: argparse.Namespace) -> int:
    """Inside a step's process: run its function; an exception is recorded in the part file."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: a run it started is stopped too
    step = Step("cpu" if args.dry_run else "cuda", args.dry_run, args.deadline, args.part, args.work)
    return call_step(args.step, step)


def call_step(name: str, step: Step) -> int:
    """Run step `name`'s function on `step`; an exception is recorded in its part (exit status 1)."""
    import traceback

    step.work.mkdir(parents=True, exist_ok=True)
    module, function = STEPS[name][0].split(":")
    try:
        getattr(importlib.import_module(module), function)(step)
    except Exception as err:
        step.put("status", "fail")
        step.put("reason", f"{type(err).__name__}: {err}"[:2000])
        step.put("traceback", traceback.format_exc()[-3000:])
        return 1
    return 0


def run_inline(name: str, work: Path, deadline: float) -> dict[str, Any]:
    """A dry run's step, in this process: the CPU at tiny sizes needs no isolation, and a child's imports
    (torch, transformers: seconds each) would be most of the dry run's time."""
    start = time.time()
    step = Step("cpu", True, deadline, work / f"{name}.part.json", work / name)
    code = call_step(name, step)
    return _finish(dict(step.record), code == 0, start)


def goals_table(steps: dict[str, dict[str, Any]], dry_run: bool) -> dict[str, dict[str, Any]]:
    """Each issue-37 goal with its figure from this run and whether it is met (None: not measured, or a
    dry run, whose tiny CPU figures say nothing of the goals)."""
    decode, update = steps.get("decode", {}), steps.get("update", {})
    fp8 = steps.get("fp8_decode", {})
    fp8_64, fp8_256 = (fp8.get(f"7B/{rows}", {}).get("ratio_to_bf16_roofline") for rows in (64, 256))
    hf = steps.get("hf_baseline", {}).get("0.5B/64/hf_static_compiled", {})
    ours = decode.get("0.5B/64", {}).get("ms_per_step")
    speedup = round(hf["ms_per_step"] / ours, 3) if ours and hf.get("ms_per_step") else None
    mfus = [
        v["mfu"] for k, v in update.items() if k.startswith("update") and isinstance(v, dict) and "mfu" in v
    ]
    first = steps.get("first_step", {}).get("example_1.5B", {}).get("startup", {}).get("to_first_step_s")
    demo = steps.get("hooks", {}).get("demo_gpu", {})
    rows = [
        ("decode_7B_64_over_roofline", decode.get("7B/64", {}).get("ratio_to_roofline"), "<=", 1.4),
        ("decode_7B_256_over_roofline", decode.get("7B/256", {}).get("ratio_to_roofline"), "<=", 1.6),
        ("decode_7B_64_fp8_over_bf16_roofline", fp8_64, "<", 1.0),
        ("decode_7B_256_fp8_over_bf16_roofline", fp8_256, "<", 1.0),
        ("decode_0.5B_64_speedup_over_hf_compiled", speedup, ">=", 2.0),
        ("update_1.5B_mfu", max(mfus) if mfus else None, ">=", 0.45),
        ("first_step_1.5B_s", first, "<=", 25.0),
        ("async_speedup_over_sync", steps.get("async_vs_sync", {}).get("async_speedup"), ">", 1.0),
        ("demo_gpu_s", demo.get("seconds") if demo.get("status") == "pass" else None, "<", 300.0),
        ("grpo_step_speedup_over_trl", steps.get("trl", {}).get("quartet_speedup"), ">=", 2.0),
    ]
    ops = {"<=": float.__le__, ">=": float.__ge__, "<": float.__lt__, ">": float.__gt__}
    return {
        name: {
            "figure": fig,
            "goal": f"{op} {bound}",
            "met": None if fig is None or dry_run else ops[op](float(fig), bound),
        }
        for name, fig, op, bound in rows
    }


def _write(out: Path, record: dict[str, Any]) -> None:
    record["goals"] = goals_table(record["steps"], record["dry_run"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    tmp.replace(out)


def orchestrate(args: argparse.Namespace) -> int:
    names = [n for n in args.only.split(",") if n] or list(STEPS)
    unknown = sorted(set(names) - set(STEPS))
    if unknown:
        print(f"unknown steps {unknown}; the steps are {list(STEPS)}", file=sys.stderr)
        return 2
    end = time.time() + args.budget
    out = args.out / "goals.json"
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": args.dry_run,
        "budget_s": args.budget,
        "device": torch.cuda.get_device_name(0) if not args.dry_run else f"cpu ({platform.processor()})",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "steps": {},
    }
    with tempfile.TemporaryDirectory(prefix="quartet-goals-") as tmp:
        for name in names:
            _, estimate, least = STEPS[name]
            left = end - time.time()
            if left < least and not args.dry_run:
                result = {
                    "status": "skip",
                    "reason": f"{left:.0f} s of the budget left, the step needs {least:.0f}",
                }
            else:
                log(f"{name}: starting, {left:.0f} s of the budget left")
                deadline = min(end, time.time() + 1.5 * estimate)
                run = run_inline if args.dry_run else run_step
                result = run(name, Path(tmp), deadline)
            record["steps"][name] = result
            reason = str(result.get("reason", ""))[:300]
            log(f"{name}: {result['status']} in {result.get('seconds', 0)} s {reason}")
            _write(out, record)
    log(f"wrote {out}")
    failed = [n for n, r in record["steps"].items() if r["status"] == "fail"]
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: proves the script runs")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for every step together")
    parser.add_argument("--only", default="", help="comma-separated step names")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/gpu"), help="folder of goals.json"
    )
    parser.add_argument("--step", choices=list(STEPS), help=argparse.SUPPRESS)
    parser.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.step:
        return step_main(args)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "no CUDA device here: run with --dry-run (CPU, tiny sizes), or on a GPU machine", file=sys.stderr
        )
        return 2
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
