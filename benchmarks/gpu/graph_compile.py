"""What `torch.compile` inside the CUDA graph would add to the built-in engine's decode step (not built).

    PYTHONPATH=src python benchmarks/gpu/graph_compile.py          # CUDA: the GPU kit's 0.36B model, bf16
    .venv/bin/python benchmarks/gpu/graph_compile.py --dry-run     # CPU, tiny model, no graph

One bucket (64 rows, 33 cached tokens): the engine's `BucketedDecoder` replays the eager forward, and a
second one replays the same forward compiled by inductor (fixed shapes), so its elementwise kernels are
fused. Reports the compile and capture seconds, the median time of a decode call (inputs copied in, the
replay, the logits copied out), and the largest logit difference between the two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from checks import ROOT, Context, build_model  # noqa: E402


def _time_calls(ctx: Context, fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        if ctx.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if ctx.cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu" / "graph_compile.json"
    )
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device here: --dry-run runs on the CPU", file=sys.stderr)
        return 2
    from quartet.models.loading import load_causal_lm
    from quartet.rollout.torch.graph_decode import BucketedDecoder
    from quartet.rollout.torch.model_runner import DecoderRunner

    rows, prompt = (4, 8) if args.dry_run else (64, 32)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        ctx = Context(device="cpu" if args.dry_run else "cuda", dry_run=args.dry_run, work=Path(tmp))
        build_model(ctx)
        model = load_causal_lm(ctx.model_dir, dtype=torch.float32 if args.dry_run else torch.bfloat16)
        model = model.to(ctx.device).eval()
        runner = DecoderRunner(model)
        cache = runner.new_cache(rows)
        cache.ensure_capacity(256, used=0)
        ids = torch.randint(5, 400, (rows, prompt), device=ctx.device)
        lengths = torch.full((rows,), prompt, device=ctx.device)
        tokens = runner.prefill(ids, lengths, cache, 0, None).argmax(-1)
        eager = BucketedDecoder(runner, rows, capture=True)
        want = eager.decode(tokens, lengths, prompt + 1, cache)
        eager_ms = _time_calls(ctx, lambda: eager.decode(tokens, lengths, prompt + 1, cache), 50)
        compiled = torch.compile(runner.decode, dynamic=False)
        compiled_runner = SimpleNamespace(model=model, decode=compiled, last_routing=None)
        fused = BucketedDecoder(compiled_runner, rows, capture=True)  # type: ignore[arg-type]
        began = time.perf_counter()
        got = fused.decode(tokens, lengths, prompt + 1, cache)  # compiles, then captures
        if ctx.cuda:
            torch.cuda.synchronize()
        first_s = time.perf_counter() - began
        fused_ms = _time_calls(ctx, lambda: fused.decode(tokens, lengths, prompt + 1, cache), 50)
        diff = float((got.float() - want.float()).abs().max())
    record: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if ctx.cuda else "cpu",
        "torch": torch.__version__,
        "rows": rows,
        "graphs": ctx.cuda,
        "eager_forward_call_ms": round(eager_ms, 3),
        "compiled_forward_call_ms": round(fused_ms, 3),
        "speedup": round(eager_ms / fused_ms, 3),
        "compile_and_capture_s": round(first_s, 2),
        "max_logit_difference": diff,
    }
    print(json.dumps(record, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
