"""Weights over CUDA IPC between two processes on one GPU, and whether NCCL runs two ranks on one GPU.

    PYTHONPATH=src python benchmarks/gpu/cuda_ipc_check.py --out cuda_ipc.json     # a CUDA machine (< 60 s)
    .venv/bin/python benchmarks/gpu/cuda_ipc_check.py --dry-run --out x.json       # anywhere: shm on CPU

This process is the sender (the trainer's role): it holds a Qwen2-1.5B-shaped set of bf16 tensors (1.54B
parameters, 3.1 GB; the 467 MB embedding is larger than a 256 MB bucket, so it travels alone) and pushes
3 versions through `quartet.weight_sync` with `SyncTransport.CUDA_IPC`. A spawned receiver (the rollout's
role) copies every bucket into its own parameters, then checks them bitwise (as int16) against the same
values regenerated from the version's seed, tensor by tensor. The JSON reports, per version, GB/s on each
side and the equality, next to a plain device-to-device copy of one bucket in one process (the ceiling).

Then NCCL: two ranks, both on cuda:0, try an all_reduce, in a subprocess under `timeout` so a hang cannot
stall the script; the JSON says what happened (NCCL refuses a communicator with two ranks on one device,
"Duplicate GPU detected", since 2.5; see docs/async.md). `--dry-run` runs the same protocol on the CPU
(host shared memory, tiny shapes) and skips NCCL.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from quartet.weight_sync import (  # noqa: E402
    GroupConfig,
    SyncTransport,
    WeightReceiver,
    WeightSender,
    connect,
    listen,
)

FULL = {"hidden": 1536, "inter": 8960, "layers": 28, "vocab": 151936, "kv": 256}
"""Qwen2-1.5B's shapes (tied embedding)."""
TINY = {"hidden": 64, "inter": 160, "layers": 2, "vocab": 1000, "kv": 16}
VERSIONS = (1, 2, 3)
HOST = "127.0.0.1"


def _sig(x: float) -> float:
    """Four significant digits (CPU dry runs move kilobytes, a GPU gigabytes)."""
    return float(f"{x:.4g}")


def shapes(dims: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    """Parameter names and shapes of a Qwen2-like model of `dims`."""
    h, f, kv = dims["hidden"], dims["inter"], dims["kv"]
    out: list[tuple[str, tuple[int, ...]]] = [("embed_tokens.weight", (dims["vocab"], h))]
    for i in range(dims["layers"]):
        p = f"layers.{i}."
        out += [
            (p + "q.weight", (h, h)),
            (p + "q.bias", (h,)),
            (p + "k.weight", (kv, h)),
            (p + "k.bias", (kv,)),
        ]
        out += [(p + "v.weight", (kv, h)), (p + "v.bias", (kv,)), (p + "o.weight", (h, h))]
        out += [(p + "gate.weight", (f, h)), (p + "up.weight", (f, h)), (p + "down.weight", (h, f))]
        out += [(p + "norm1.weight", (h,)), (p + "norm2.weight", (h,))]
    return out + [("norm.weight", (h,))]


def values(version: int, shape: tuple[int, ...], gen: torch.Generator, device: str) -> torch.Tensor:
    """Random bf16 bit patterns (NaNs and all): the same on both sides for the same seed and order."""
    bits = torch.randint(-(2**15), 2**15, shape, dtype=torch.int16, generator=gen, device=device)
    return bits.view(torch.bfloat16)


def generate(version: int, dims: dict[str, int], device: str) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(version)
    return [(name, values(version, shape, gen, device)) for name, shape in shapes(dims)]


def receiver(port: int, dims: dict[str, int], device: str, results: Any) -> None:
    """The rollout's side: receive each version into its own parameters, then check them bitwise."""
    try:
        if device == "cuda":
            torch.cuda.set_device(0)
        params = {
            name: torch.empty(shape, dtype=torch.bfloat16, device=device) for name, shape in shapes(dims)
        }

        def load(tensors: list[tuple[str, torch.Tensor]]) -> None:
            for name, tensor in tensors:
                params[name].copy_(tensor)

        with connect(GroupConfig(HOST, port, 2, timeout_s=60), 1) as group:
            weights = WeightReceiver(group)
            for _ in VERSIONS:
                stats = weights.receive(load, timeout_s=60)
                gen = torch.Generator(device=device).manual_seed(stats.version)
                equal = all(
                    torch.equal(
                        params[name].view(torch.int16),
                        values(stats.version, shape, gen, device).view(torch.int16),
                    )
                    for name, shape in shapes(dims)
                )
                results.put(("received", stats.version, stats.bytes, stats.seconds, stats.buckets, equal))
    except Exception as exc:  # reported, so the sender fails with the receiver's reason
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def copy_ceiling(nbytes: int, device: str) -> float:
    """GB/s of one plain copy of `nbytes` in this process: what a receiver's copy can at best reach."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    if device == "cuda":
        torch.cuda.synchronize()
    return 5 * nbytes / (time.perf_counter() - start) / 1e9


def push(dims: dict[str, int], device: str, bucket_bytes: int, report: dict[str, Any], out: Path) -> None:
    """Send 3 versions to a spawned receiver; fills `report["versions"]`."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    listener = listen(GroupConfig(HOST, 0, 2, timeout_s=120))
    child = ctx.Process(target=receiver, args=(listener.port, dims, device, results), daemon=True)
    child.start()
    transport = SyncTransport.CUDA_IPC if device == "cuda" else SyncTransport.SHM
    try:
        with listener.accept() as group:
            sender = WeightSender(group, bucket_bytes, transport)
            for version in VERSIONS:
                weights = generate(version, dims, device)
                sent = sender.send(iter(weights), version, timeout_s=60)
                del weights
                got = results.get(timeout=120)
                if got[0] == "error":
                    raise RuntimeError(f"the receiver failed: {got[1]}")
                _, v, nbytes, seconds, buckets, equal = got
                report["versions"].append(
                    {
                        "version": v,
                        "bytes": nbytes,
                        "buckets": buckets,
                        "sender_seconds": _sig(sent.seconds),
                        "sender_gb_per_s": _sig(sent.gb_per_s),
                        "receiver_gb_per_s": _sig(nbytes / seconds / 1e9),
                        "bitwise_equal": equal,
                    }
                )
                out.write_text(json.dumps(report, indent=1))
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()


def nccl_rank(rank: int, init_file: str) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2)
    value = torch.full((1,), float(rank + 1), device="cuda:0")
    dist.all_reduce(value)
    torch.cuda.synchronize()
    print(f"rank {rank}: all_reduce gave {value.item()} (3.0 expected)", flush=True)
    dist.destroy_process_group()


def nccl_probe() -> None:
    """Two NCCL ranks on cuda:0 (run under `timeout` by `nccl_two_ranks`)."""
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        ranks = [ctx.Process(target=nccl_rank, args=(r, f"{tmp}/init")) for r in range(2)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join()
        print("exit codes", [p.exitcode for p in ranks], flush=True)
        sys.exit(max(abs(p.exitcode or 0) for p in ranks))


def nccl_two_ranks(limit_s: int) -> dict[str, Any]:
    env = os.environ | {"NCCL_DEBUG": "WARN", "PYTHONUNBUFFERED": "1"}
    cmd = ["timeout", "-k", "5", str(limit_s), sys.executable, __file__, "--nccl-probe", "--out", os.devnull]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    output = (done.stdout + done.stderr)[-3000:]
    if "Duplicate GPU" in output:  # first: the other rank may then hang until the timeout kills it
        outcome = "refused: NCCL reports 'Duplicate GPU detected' (ncclInvalidUsage)"
    elif done.returncode in (124, 137):
        outcome = f"hung: killed after {limit_s} s"
    elif done.returncode == 0 and output.count("3.0 expected") == 2 and "gave 3.0" in output:
        outcome = "worked: all_reduce over two ranks on one GPU gave the right sum"
    else:
        outcome = f"failed with exit code {done.returncode} (see output_tail)"
    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None  # type: ignore[no-untyped-call]
    return {
        "outcome": outcome,
        "returncode": done.returncode,
        "seconds": round(time.perf_counter() - start, 1),
        "nccl_version": nccl,
        "output_tail": output,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON written here (as it goes)")
    parser.add_argument("--dry-run", action="store_true", help="the same protocol on the CPU, tiny shapes")
    parser.add_argument("--bucket-mb", type=int, default=256, help="bucket size bound in MiB")
    parser.add_argument(
        "--nccl-timeout", type=int, default=30, help="seconds before the NCCL probe is killed"
    )
    parser.add_argument("--nccl-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nccl_probe:
        nccl_probe()
        return
    device = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    dims = TINY if device == "cpu" else FULL
    bucket_bytes = (64 * 1024) if args.dry_run else args.bucket_mb * 2**20
    params = sum(torch.Size(s).numel() for _, s in shapes(dims))
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "transport": "cuda_ipc" if device == "cuda" else "shm",
        "torch": torch.__version__,
        "parameters": params,
        "bytes": 2 * params,
        "bucket_bytes": bucket_bytes,
        "copy_ceiling_gb_per_s": _sig(copy_ceiling(bucket_bytes, device)),
        "versions": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    push(dims, device, bucket_bytes, report, args.out)
    report["all_bitwise_equal"] = all(v["bitwise_equal"] for v in report["versions"])
    if device == "cuda":
        report["nccl_two_ranks_one_gpu"] = nccl_two_ranks(args.nccl_timeout)
    else:
        report["nccl_two_ranks_one_gpu"] = {"outcome": "skipped: no GPU (dry run)"}
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "nccl_two_ranks_one_gpu"}, indent=1))
    print("nccl:", report["nccl_two_ranks_one_gpu"]["outcome"])
    sys.exit(0 if report["all_bitwise_equal"] and len(report["versions"]) == len(VERSIONS) else 1)


if __name__ == "__main__":
    main()
