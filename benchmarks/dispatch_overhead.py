"""Overhead of one dispatched call on a 4-rank colocated group (local Ray, CPU slots).

    .venv/bin/python benchmarks/dispatch_overhead.py [--calls 200] [--inline-kib 0]

Times, median over `--calls` calls after a warmup: an empty broadcast method, an empty rank-zero method,
and a split call on a 1 MB Batch (131072 float64 values: 4 chunks out, 4 chunks back, joined), on a 4-rank
Ray group and on the local backend (one rank, in-process: the floor of the dispatch code itself).
`--inline-kib N` starts Ray with objects up to N KiB sent inline with the call instead of through the
object store (Ray's `max_direct_call_object_size`, default 100 KiB).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import ray
import torch

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.dispatch import Split, dispatch
from quartet.cluster.local import colocate_local
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.core.batch import Batch


class Echo:
    @dispatch(Split.BROADCAST)
    def nothing(self) -> None:
        return None

    @dispatch(Split.RANK_ZERO)
    def nothing_zero(self) -> None:
        return None

    @dispatch(Split.BY_DP_RANK)
    def echo(self, batch: Batch) -> Batch:
        return batch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--inline-kib", type=int, default=0)
    args = parser.parse_args()
    system = {"max_direct_call_object_size": args.inline_kib << 10} if args.inline_kib else None
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _system_config=system)
    hosts = colocate(
        ResourcePool(1, 4, 0.5, use_gpu=False).create(), RunNames("bench", "dispatch"), echo=RoleSpec(Echo)
    )
    batch = Batch({"x": torch.randn(1024, 128, dtype=torch.float64)})  # 1 MiB
    inline = f"objects <= {args.inline_kib} KiB inline" if args.inline_kib else "Ray's default inlining"
    print(f"median of {args.calls} calls ({inline})")
    _time_cases("4-rank Ray group", hosts.groups["echo"], batch, args.calls)
    hosts.shutdown()
    local = colocate_local(RunNames("bench", "local"), echo=RoleSpec(Echo))
    _time_cases("local backend, 1 rank", local.groups["echo"], batch, args.calls)
    local.shutdown()
    ray.shutdown()


def _time_cases(title: str, group: Any, batch: Batch, calls: int) -> None:
    cases = {
        "broadcast, empty method": lambda: group.nothing(),
        "rank zero, empty method": lambda: group.nothing_zero(),
        "split 1 MiB Batch, echo": lambda: group.echo(batch),
    }
    print(title)
    for name, fn in cases.items():
        for _ in range(10):
            fn()
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        p90 = sorted(times)[int(0.9 * len(times))]
        print(f"  {name:<28} {statistics.median(times) * 1e3:7.2f} ms (p90 {p90 * 1e3:.2f})")


if __name__ == "__main__":
    main()
