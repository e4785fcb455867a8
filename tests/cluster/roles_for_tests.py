"""Role classes used by the cluster tests (importable by Ray workers)."""

from __future__ import annotations

import os
import time

import torch

from quartet.cluster.dispatch import DataRank, Split, dispatch
from quartet.core.batch import Batch


class Doubler:
    """Split a batch: each rank doubles its rows and tags them with its rank."""

    def __init__(self, offset: float = 0.0) -> None:
        self.offset = offset
        self.calls = 0

    @dispatch(Split.BY_DP_RANK)
    def double(self, batch: Batch) -> Batch:
        self.calls += 1
        rank = int(os.environ["RANK"])
        n = len(batch)
        x = batch["x"] if "x" in batch else batch["twice"]  # a chained call gets the previous output
        return Batch({"twice": x * 2 + self.offset, "rank": torch.full((n,), rank)})

    @dispatch(Split.BROADCAST)
    def rank_and_arg(self, value: int) -> tuple[int, int]:
        return int(os.environ["RANK"]), value

    @dispatch(Split.RANK_ZERO)
    def only_zero(self, value: int) -> tuple[int, int]:
        return int(os.environ["RANK"]), value * 10

    @dispatch(Split.BROADCAST)
    def pid(self) -> int:
        return os.getpid()

    @dispatch(Split.BROADCAST)
    def threads(self) -> tuple[str, int]:
        """(OMP_NUM_THREADS as the host was given it, torch's intra-op threads: at most the cores)."""
        return os.environ.get("OMP_NUM_THREADS", ""), torch.get_num_threads()

    @dispatch(Split.BROADCAST)
    def call_count(self) -> int:
        return self.calls

    @dispatch(Split.BROADCAST)
    def fail(self) -> None:
        raise ValueError("boom from rank " + os.environ["RANK"])

    def not_declared(self) -> None:
        """Public but not callable from the driver."""


class Counter:
    """A second role with its own state."""

    def __init__(self, start: int) -> None:
        self.value = start

    @dispatch(Split.BROADCAST)
    def add(self, k: int) -> int:
        self.value += k
        return self.value

    @dispatch(Split.BROADCAST)
    def pid(self) -> int:
        return os.getpid()


class AllReducer:
    """Initialises torch.distributed (gloo) from the environment the host set."""

    def __init__(self) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method="env://")

    @dispatch(Split.BROADCAST)
    def all_reduce(self, value: float) -> float:
        import torch.distributed as dist

        t = torch.tensor([value * (dist.get_rank() + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @dispatch(Split.BROADCAST)
    def all_reduce_except(self, skip_rank: int) -> int:
        """Every rank but `skip_rank` joins an all-reduce: they block in it until gloo's own timeout."""
        import torch.distributed as dist

        if dist.get_rank() != skip_rank:
            dist.all_reduce(torch.ones(1))
        return dist.get_rank()


class Stalling:
    """A role whose `update` never returns on one rank (a rank alive but stuck)."""

    @dispatch(Split.BROADCAST)
    def update(self, stuck_rank: int) -> int:
        rank = int(os.environ["RANK"])
        if rank == stuck_rank:
            time.sleep(3600)
        return rank


class BrokenInit:
    def __init__(self) -> None:
        raise RuntimeError("cannot start: missing weights")

    @dispatch(Split.BROADCAST)
    def ping(self) -> int:
        return 1


class SlowInit:
    """A role whose constructor takes `seconds` (a model loading on a busy machine)."""

    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    @dispatch(Split.BROADCAST)
    def ping(self) -> int:
        return 1


class TensorParallelEcho:
    """Ranks in tensor-parallel pairs: (0, 1) share data chunk 0, (2, 3) chunk 1; the even rank collects."""

    def __init__(self, tp: int = 2) -> None:
        self.rank, self.world, self.tp = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), tp

    def data_rank(self) -> DataRank:
        return DataRank(self.rank // self.tp, self.world // self.tp, collect=self.rank % self.tp == 0)

    @dispatch(Split.BY_DP_RANK)
    def tag(self, batch: Batch) -> Batch:
        n = len(batch)
        return Batch({"x": batch["x"], "rank": torch.full((n,), self.rank)})

    @dispatch(Split.BY_DP_RANK)
    def seen(self, batch: Batch) -> list[float]:
        return [float(v) for v in batch["x"]]

    @dispatch(Split.BROADCAST)
    def my_rank(self) -> int:
        return self.rank


class TwoCollectors(TensorParallelEcho):
    """A wrong layout: both ranks of a pair say they collect."""

    def data_rank(self) -> DataRank:
        return DataRank(self.rank // self.tp, self.world // self.tp, collect=True)


class ProcessFacts:
    """What a host process has: its pid, torch's threads, and whether a module was imported before."""

    @dispatch(Split.BROADCAST)
    def facts(self, module: str) -> tuple[int, int, bool]:
        import sys

        return os.getpid(), torch.get_num_threads(), module in sys.modules
