"""Where a decode step of the built-in engine spends its time: the forward (eager or a CUDA-graph replay),
the sampling, and the engine's bookkeeping.

    PYTHONPATH=src python benchmarks/gpu/decode_profile.py            # CUDA: the GPU kit's 0.36B model
    .venv/bin/python benchmarks/gpu/decode_profile.py --dry-run       # CPU, tiny model

The engine's core is driven step by step on this thread (its own thread stays idle), each part timed with
the device synchronized before and after it, so the parts add up to the step. Then a few steps run under
`torch.profiler` for the busiest host-side operations. Writes JSON next to the GPU kit's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks import ROOT, Context, build_model  # noqa: E402


def _timed(
    parts: dict[str, list[float]], name: str, fn: Callable[..., Any], cuda: bool
) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if cuda:
            torch.cuda.synchronize()
        parts.setdefault(name, []).append(time.perf_counter() - start)
        return out

    return wrapper


def profile_engine(ctx: Context, cuda_graphs: bool, seqs: int, new: int) -> dict[str, Any]:
    from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    requests = [
        GenerationRequest(
            tuple(range(5, 37)), SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True, seed=s)
        )
        for s in range(seqs)
    ]
    with TorchRolloutEngine.from_pretrained(
        ctx.model_dir, dtype=dtype, device=ctx.device, max_num_seqs=seqs, cuda_graphs=cuda_graphs
    ) as eng:
        eng.generate(requests)  # warm-up (captures)
        core = eng.core
        parts: dict[str, list[float]] = {}
        if core.decoder is not None:
            core.decoder.decode = _timed(parts, "forward", core.decoder.decode, ctx.cuda)  # type: ignore[method-assign]
        core.runner.decode = _timed(parts, "forward", core.runner.decode, ctx.cuda)  # type: ignore[method-assign]
        core._sample = _timed(parts, "sample", core._sample, ctx.cuda)  # type: ignore[method-assign]
        core._append = _timed(parts, "append", core._append, ctx.cuda)  # type: ignore[method-assign]
        steps: list[float] = []
        with torch.inference_mode():
            for request in requests:
                core.add(request)
            core.step()  # the prefill
            parts.clear()
            while core.has_work():
                if ctx.cuda:
                    torch.cuda.synchronize()
                start = time.perf_counter()
                core.step()
                if ctx.cuda:
                    torch.cuda.synchronize()
                steps.append(time.perf_counter() - start)
        for request in requests:
            core.add(request)
        with torch.inference_mode(), torch.profiler.profile() as prof:
            for _ in range(6):
                core.step()
        while core.has_work():
            core.step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    step_ms = 1000 * statistics.median(steps)
    medians = {k: round(1000 * statistics.median(v), 3) for k, v in parts.items()}
    return {
        "cuda_graphs": cuda_graphs,
        "decode_steps": len(steps),
        "step_ms": round(step_ms, 3),
        "parts_ms": medians,
        "rest_ms": round(step_ms - sum(medians.values()), 3),
        "profile": table,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu" / "decode_profile.json"
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device here: --dry-run runs on the CPU", file=sys.stderr)
        return 2
    seqs, new = (8, 16) if args.dry_run else (64, 128)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Context(device="cpu" if args.dry_run else "cuda", dry_run=args.dry_run, work=Path(tmp))
        build_model(ctx)
        runs = [
            profile_engine(ctx, graphs, seqs, new) for graphs in ((False,) if args.dry_run else (False, True))
        ]
    for run in runs:
        print(run["profile"])
    for run in runs:
        print(
            f"cuda_graphs={run['cuda_graphs']}: {run['step_ms']} ms a step; parts {run['parts_ms']}; "
            f"rest {run['rest_ms']} ms"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if not args.dry_run else "cpu"
    record = {"device": device, "torch": torch.__version__, "rows": seqs, "new_tokens": new, "runs": runs}
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
