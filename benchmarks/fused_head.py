"""The fused log-prob/entropy head against the plain one: forward+backward time and peak memory.

Plain: the lm_head's logits [N, V] (under autocast on CUDA: bf16), then `engines.heads` (float32 log-softmax
in chunks, `core.entropy`'s checkpointed entropy). Fused: `engines.fused_head` from the hidden states
[N, H] and the lm_head weight [V, H], in token chunks and vocabulary blocks. Both take the loss
sum(log p) + 0.01 sum(H) (an entropy bonus, so the entropy's backward runs too) and backpropagate to the
hidden states and the weight, as in the actor's update. The hidden states and the weight are float32
(the residual stream and the master weight); on CUDA the matmuls run under bf16 autocast as in the engine.

Peak memory is what the pass adds on top of its inputs: on CUDA `torch.cuda.max_memory_allocated`; on CPU
the growth of the process's peak resident set (each path runs in a fresh process, so one path's peak does
not hide the other's).

    .venv/bin/python benchmarks/fused_head.py                   # CPU: N=1024, H=896, V=151936, float32
    .venv/bin/python benchmarks/fused_head.py --device cuda     # GPU: N=8192, H=1536, V=151936, bf16

    .venv/bin/python benchmarks/fused_head.py --v 512 --h 256 --n 2048 --repeats 5 \
        --name fused_head_small_vocab

Results: `benchmarks/results/<name>.json` (CPU) or `benchmarks/results/gpu/<name>.json` (CUDA).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS_DIR, table, write_result  # noqa: E402

from quartet.engines import heads  # noqa: E402
from quartet.engines.fused_head import TOKEN_CHUNK, fused_logprobs_entropy  # noqa: E402

DEFAULTS = {"cpu": (1024, 896, 151_936, 2, "8192"), "cuda": (8192, 1536, 151_936, 10, "8192,32768")}
"""N, H, V, timed repeats and the fused head's vocabulary blocks per device (the CPU sizes keep the plain
path near 3 GB)."""


def _inputs(n: int, h: int, v: int, device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(n, h, device=device, generator=g).requires_grad_()
    weight = (torch.randn(v, h, device=device, generator=g) / h**0.5).requires_grad_()
    targets = torch.randint(0, v, (n,), device=device, generator=g)
    return hidden, weight, targets


def _step(path: str, block: int, inputs: tuple[torch.Tensor, ...], temperature: float) -> None:
    hidden, weight, targets = inputs
    device = hidden.device.type
    autocast = torch.autocast(device, torch.bfloat16) if device == "cuda" else nullcontext()
    with autocast:
        if path == "plain":
            logits = F.linear(hidden, weight).unsqueeze(0)
            lp = heads.response_logprobs(logits, targets.unsqueeze(0), temperature)
            ent = heads.response_entropy(logits, temperature)
        else:
            lp, ent_or_none = fused_logprobs_entropy(
                hidden, weight, None, targets, temperature, with_entropy=True, vocab_block=block
            )
            assert ent_or_none is not None
            ent = ent_or_none
    (lp.sum() + 0.01 * ent.sum()).backward()
    hidden.grad = weight.grad = None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(path: str, block: int, n: int, h: int, v: int, device: str, repeats: int) -> dict[str, Any]:
    """Peak extra bytes of one path's forward+backward (its first, warm-up pass) and the times (ms) of
    `repeats` more passes."""
    inputs = _inputs(n, h, v, device)
    _sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _step(path, block, inputs, 0.9)  # warm-up; its peak is the pass's peak
    _sync(device)
    if device == "cuda":
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        _step(path, block, inputs, 0.9)
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return {"path": path, "vocab_block": block, "ms": times, "peak_bytes": int(peak)}


def _in_fresh_process(args: argparse.Namespace, path: str, block: int) -> dict[str, Any]:
    """A CPU measurement in a process of its own (its peak RSS is this path's alone)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", path, "--block", str(block)]
    cmd += ["--device", args.device]
    cmd += ["--n", str(args.n), "--h", str(args.h), "--v", str(args.v), "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--n", type=int, default=None, help="tokens (default: per device)")
    parser.add_argument("--h", type=int, default=None, help="hidden size")
    parser.add_argument("--v", type=int, default=None, help="vocabulary size")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats after one warm-up")
    parser.add_argument("--blocks", default=None, help="the fused head's vocabulary blocks, comma-separated")
    parser.add_argument("--one", choices=["plain", "fused"], help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, default=8192, help=argparse.SUPPRESS)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--name", default="fused_head", help="result file name (without .json)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (CI)")
    args = parser.parse_args()
    n, h, v, repeats, blocks = (96, 16, 1000, 1, "256") if args.smoke else DEFAULTS[args.device]
    args.blocks = args.blocks or blocks
    args.n, args.h, args.v = args.n or n, args.h or h, args.v or v
    args.repeats = args.repeats or repeats
    if args.one:  # a child process of a CPU run: the peak only
        print(json.dumps(measure(args.one, args.block, args.n, args.h, args.v, args.device, 0)))
        return
    runs = [("plain", 0)] + [("fused", int(b)) for b in args.blocks.split(",")]
    raw = []
    for path, block in runs:  # peaks, each path alone
        if args.device == "cpu" and not args.smoke:  # (the smoke stays in one interpreter: CI time)
            raw.append(_in_fresh_process(args, path, block))
        else:
            raw.append(measure(path, block, args.n, args.h, args.v, args.device, 0))
            if args.device == "cuda":
                torch.cuda.empty_cache()
    # times: the paths alternate round by round, so a change in the machine's load hits them alike
    inputs = _inputs(args.n, args.h, args.v, args.device)
    for _ in range(args.repeats):
        for r in raw:
            _sync(args.device)
            start = time.perf_counter()
            _step(r["path"], r["vocab_block"], inputs, 0.9)
            _sync(args.device)
            r["ms"].append((time.perf_counter() - start) * 1e3)
    _report(args, raw)


def _report(args: argparse.Namespace, raw: list[dict[str, Any]]) -> None:
    plain = raw[0]
    rows, summary = [], {}
    for r in raw:
        ms = statistics.median(r["ms"])
        name = "plain" if r["path"] == "plain" else f"fused_block{r['vocab_block']}"
        summary[f"{name}_ms"] = ms
        summary[f"{name}_peak_bytes"] = r["peak_bytes"]
        speed = statistics.median(plain["ms"]) / ms
        rows.append([name, ms, r["peak_bytes"] / 2**20, speed, plain["peak_bytes"] / max(r["peak_bytes"], 1)])
    n, v = args.n, args.v
    summary["logits_bytes_bf16"] = n * v * 2
    summary["logits_bytes_fp32"] = n * v * 4
    dtype = "bfloat16 autocast" if args.device == "cuda" else "float32"
    settings = {"device": args.device, "n": n, "h": args.h, "v": v, "repeats": args.repeats, "dtype": dtype}
    settings.update(token_chunk=TOKEN_CHUNK, loss="sum(logprob) + 0.01 sum(entropy)", temperature=0.9)
    if args.device == "cuda":
        settings["gpu"] = torch.cuda.get_device_name()
    out_dir = args.out_dir or (RESULTS_DIR / "gpu" if args.device == "cuda" else RESULTS_DIR)
    path = write_result(args.name, settings, raw, summary, out_dir=out_dir)
    print(table(["path", "fwd+bwd ms", "peak MiB", "speed vs plain", "memory vs plain"], rows))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
