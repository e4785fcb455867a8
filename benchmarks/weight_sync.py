"""Weight-sync throughput: a model's weights streamed from a trainer process to rollout processes.

    .venv/bin/python benchmarks/weight_sync.py    # a Qwen2 of hidden 256, 8 layers; 1 receiver
    .venv/bin/python benchmarks/weight_sync.py --receivers 2 --bucket-mib 16
    .venv/bin/python benchmarks/weight_sync.py --transport shm     # buckets as shared-memory handles

Two (or more) real processes on a standalone gloo group (`quartet.weight_sync`): the sender streams the
weights of a tiny Qwen2 built from a config (no download) in buckets of `--bucket-mib`; in the same run and
the same group, a plain broadcast of the same number of bytes as one tensor gives the floor. Reported per
repeat: seconds, GB/s, and the ratio sync / plain (1.0 = no cost beyond moving the bytes). Writes
`benchmarks/results/weight_sync.json`. With `--transport shm` the buckets stay in the sender's shared memory
and only handles travel (the CPU twin of CUDA IPC); each receiver then copies every tensor out (what the
broadcast does for it), and the record is `weight_sync_shm.json`.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from typing import Any

import torch
from common import spread, table, write_result

HOST = "127.0.0.1"


def model_weights(hidden: int, layers: int) -> list[tuple[str, torch.Tensor]]:
    """A Qwen2's named parameters (random init, fp32), as the trainer would stream them."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    return [(n, p.detach()) for n, p in model.named_parameters()]


def _copy_out(tensors: list[tuple[str, torch.Tensor]]) -> None:
    """A shared bucket is the sender's memory: the bytes reach this process only when copied out."""
    for _, tensor in tensors:
        tensor.clone()


def _receiver(port: int, world: int, rank: int, repeats: int, timeout: float, shared: bool, out: Any) -> None:
    from quartet.weight_sync import GroupConfig, WeightReceiver, connect, measure_plain_broadcast

    group = connect(GroupConfig(HOST, port, world, timeout_s=timeout), rank)
    receiver = WeightReceiver(group)
    load = _copy_out if shared else (lambda tensors: None)
    with group:
        for _ in range(repeats):
            stats = receiver.receive(load, timeout_s=timeout)
            measure_plain_broadcast(group, stats.bytes, timeout_s=timeout)
    out.put(("done", rank))


def run(
    receivers: int, bucket_mib: int, repeats: int, hidden: int, layers: int, transport: str = "broadcast"
) -> dict[str, Any]:
    from quartet.weight_sync import GroupConfig, SyncTransport, WeightSender, listen, measure_plain_broadcast

    weights = model_weights(hidden, layers)
    params = sum(t.numel() for _, t in weights)
    timeout = 300.0
    world = receivers + 1
    listener = listen(GroupConfig(HOST, 0, world, timeout_s=timeout))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_receiver, args=(listener.port, world, r, repeats, timeout, transport != "broadcast", out)
        )
        for r in range(1, world)
    ]
    for p in procs:
        p.start()
    rows = []
    with listener.accept() as group:
        sender = WeightSender(group, bucket_mib * 2**20, SyncTransport(transport))
        for version in range(1, repeats + 1):
            stats = sender.send(iter(weights), version=version, timeout_s=timeout)
            plain = measure_plain_broadcast(group, stats.bytes, timeout_s=timeout)
            rows.append(
                {
                    "version": version,
                    "bytes": stats.bytes,
                    "buckets": stats.buckets,
                    "tensors": stats.tensors,
                    "sync_s": stats.seconds,
                    "plain_s": plain,
                    "sync_gb_s": stats.bytes / stats.seconds / 1e9,
                    "plain_gb_s": stats.bytes / plain / 1e9,
                    "ratio": stats.seconds / plain,
                }
            )
    for p in procs:
        p.join(timeout=timeout)
    payload = sum(t.numel() * t.element_size() for _, t in weights)
    return {"params": params, "tensor_bytes": payload, "tensors": len(weights), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--bucket-mib", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--transport", choices=["broadcast", "shm"], default="broadcast")
    parser.add_argument("--smoke", action="store_true", help="CI: a 2-layer hidden-64 model, 1 MiB buckets")
    args = parser.parse_args()
    if args.smoke:
        args.hidden, args.layers, args.repeats, args.bucket_mib = 64, 2, 2, 1
    start = time.perf_counter()
    result = run(args.receivers, args.bucket_mib, args.repeats, args.hidden, args.layers, args.transport)
    rows = result["rows"][1:] or result["rows"]  # the first sync warms the group up
    print(
        table(
            ["version", "MB", "buckets", "sync s", "plain s", "sync GB/s", "plain GB/s", "sync/plain"],
            [
                [
                    r["version"],
                    f"{r['bytes'] / 1e6:.1f}",
                    r["buckets"],
                    f"{r['sync_s']:.3f}",
                    f"{r['plain_s']:.3f}",
                    f"{r['sync_gb_s']:.2f}",
                    f"{r['plain_gb_s']:.2f}",
                    f"{r['ratio']:.2f}",
                ]
                for r in result["rows"]
            ],
        )  # fmt: skip
    )
    summary = {
        "params": result["params"],
        "tensor_bytes": result["tensor_bytes"],
        "tensors": result["tensors"],
        "bytes": rows[0]["bytes"],
        "sync_s": spread([r["sync_s"] for r in rows]),
        "plain_s": spread([r["plain_s"] for r in rows]),
        "sync_gb_s_median": statistics.median(r["sync_gb_s"] for r in rows),
        "plain_gb_s_median": statistics.median(r["plain_gb_s"] for r in rows),
        "ratio_median": statistics.median(r["ratio"] for r in rows),
        "wall_s": time.perf_counter() - start,
    }
    settings = vars(args) | {"backend": "gloo", "host": HOST}
    settings.pop("out_dir")
    name = "weight_sync" if args.transport == "broadcast" else "weight_sync_shm"
    path = write_result(name, settings, result["rows"], summary, args.out_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
