"""The GPU kit: one command that, on a CUDA machine, runs quartet's GPU checks and benchmarks and writes JSON.

    python benchmarks/gpu/kit.py                 # on a CUDA machine: results/gpu/gpu_kit.json
    python benchmarks/gpu/kit.py --dry-run       # anywhere: the same code on the CPU at tiny sizes

From a copy of the working tree on a machine with torch and transformers but no Ray, put `src` on the path
(`PYTHONPATH=src`); everything runs on quartet's local backend (`checks.py`: one function per check).

Checks, in order:
- build_model: a ~0.5B Qwen2 built from a config (tiny in a dry run), saved, loaded by `from_pretrained`.
- update_and_planner: the FSDP2 engine with parameter + optimizer offload. Three steps with finite losses; the
  update's tokens/s; MFU against a measured bf16 matmul; the planner's update estimate over
  `torch.cuda.max_memory_allocated`.
- rollout_builtin: the built-in engine's tokens/s on the device, eager and from CUDA graphs (capture count
  and time, greedy agreement).
- vllm_sleep: vLLM's sleep mode releases the memory it held (skips without vllm or CUDA).
- weight_sync: the cross-process weight sync with real processes, bitwise (gloo: NCCL is not built).
- grpo_steps: two GRPO steps of the whole loop, with each phase's time.
- gpu_tests: the suite's `-m gpu` tests.
- sp_tp_one_device: the device side of sequence and tensor parallelism on one device (`parallel_check.py`):
  the vocabulary-parallel head at a 152k vocabulary, the TP plans on a one-device mesh, SP's attention; what
  needs 2+ GPUs is named in the result.

A failing check does not stop the others; the exit status is 1 when any failed. `--only a,b` runs some.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks import CHECKS, ROOT, Context  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: proves the kit runs")
    parser.add_argument("--only", default="", help="comma-separated check names")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON path (default results/gpu/gpu_kit*.json)"
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "no CUDA device here: run with --dry-run (CPU, tiny sizes), or on a GPU machine", file=sys.stderr
        )
        return 2
    names = [n for n in args.only.split(",") if n] or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        print(f"unknown checks {unknown}; the checks are {list(CHECKS)}", file=sys.stderr)
        return 2
    if "build_model" not in names:
        names = ["build_model", *names]
    out = args.out or RESULTS / ("gpu_kit_dry_run.json" if args.dry_run else "gpu_kit.json")
    record: dict[str, object] = {
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if not args.dry_run else f"cpu ({platform.processor()})",
        "checks": {},
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="quartet-gpu-kit-") as tmp:
        ctx = Context(device="cpu" if args.dry_run else "cuda", dry_run=args.dry_run, work=Path(tmp))
        for name in names:
            start = time.perf_counter()
            try:
                result = CHECKS[name](ctx)
            except Exception as err:  # one broken check must not hide the others
                result = {
                    "status": "fail",
                    "reason": f"{type(err).__name__}: {err}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            result["seconds"] = round(time.perf_counter() - start, 2)
            record["checks"][name] = result  # type: ignore[index]
            failed |= result["status"] == "fail"
            reason = str(result.get("reason", ""))[:200]
            print(f"{name:20s} {result['status']:5s} {result['seconds']:8.2f} s  {reason}", flush=True)
            _write(out, record)  # after every check: a run cut short still leaves what it measured
            if name == "build_model" and result["status"] != "pass":
                break
    print(f"wrote {out}")
    return 1 if failed else 0


def _write(out: Path, record: dict[str, object]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
