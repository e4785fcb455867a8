"""Overhead of one dispatched call on a 4-rank colocated group (local Ray, CPU slots).

    .venv/bin/python benchmarks/dispatch_overhead.py [--calls 200]

Times, median over `--calls` calls after a warmup: an empty broadcast method, an empty rank-zero method,
and a split call on a 1 MB Batch (131072 float64 values: 4 chunks out, 4 chunks back, joined).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray
import torch

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.dispatch import Split, dispatch
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
    args = parser.parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    hosts = colocate(
        ResourcePool(1, 4, 0.5, use_gpu=False).create(), RunNames("bench", "dispatch"), echo=RoleSpec(Echo)
    )
    group = hosts.groups["echo"]
    batch = Batch({"x": torch.randn(1024, 128, dtype=torch.float64)})  # 1 MiB
    cases = {
        "broadcast, empty method": lambda: group.nothing(),
        "rank zero, empty method": lambda: group.nothing_zero(),
        "split 1 MiB Batch, echo": lambda: group.echo(batch),
    }
    print(f"4-rank group, median of {args.calls} calls")
    for name, fn in cases.items():
        for _ in range(10):
            fn()
        times = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        p90 = sorted(times)[int(0.9 * len(times))]
        print(f"  {name:<28} {statistics.median(times) * 1e3:7.2f} ms (p90 {p90 * 1e3:.2f})")
    hosts.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
