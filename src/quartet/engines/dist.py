"""Process group, device and meshes of an engine, and the reductions over its ranks.

The role host sets RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT (and LOCAL_RANK on GPU nodes). If the
default process group is not initialised and WORLD_SIZE > 1, the engine initialises it: gloo on CPU, nccl
on CUDA. With one rank the model stays a plain module (no DTensors, no collectives).

FSDP2 shards the model over the mesh made here (`fsdp`, the last step of `build`).

Gradient averaging. FSDP2 reduce-scatters gradients with a MEAN over ranks. The losses handed to backward
are shares of the global mini-batch loss (divided by global counts), whose gradients must be SUMMED over
ranks; the engine multiplies each loss by the world size before backward (`DistContext.world`) to undo
the mean. That factor is exact in floating point for powers of two and needs no FSDP-internal switch.

Sequence parallelism (`sp` > 1, `engines.ulysses`). The ranks form a 2-D mesh ("dp", "sp"): a sequence
group is sp consecutive ranks that take the same rows; FSDP2 still shards over every rank (the ranks of a
group hold the same parameters). Counts of rows and tokens are summed over "dp" only (a group's ranks hold
the same rows). The loss factor stays the world size: each rank's gradient is its share of its group's
loss gradient (see `ulysses`), so the sum over all ranks is the sum over data-parallel groups.

Tensor parallelism (`tp` > 1, `engines.tensor_parallel`). The ranks form a 2-D mesh ("dp", "tp"): a tensor
group is tp consecutive ranks that take the same rows and hold different slices of each layer; FSDP2
shards over "dp" only. Every rank of a tensor group computes the WHOLE loss of its rows (the outputs are
replicated after each layer), so FSDP's mean over "dp" is undone by the data-parallel size
(`DistContext.loss_factor`), not the world size. Sequence and tensor parallelism are not combined.

Expert parallelism (`ep` > 1, `engines.expert_parallel`). The ranks also form a 2-D mesh ("edp", "ep"): an
expert group is ep consecutive ranks, each holding num_experts / ep experts of every MoE layer; "edp"
joins the ranks that hold the same experts. Rows and counts are untouched (every rank keeps its own rows,
or its tokens under sequence parallelism, which composes with it), so `dp` and the loss factor are as
without it. Expert weights are FSDP-sharded over "edp" only; their gradient scale is fixed where they are
used (see `expert_parallel`), so that the step equals one process's.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from quartet.config.parallel import pool_problems

__all__ = [
    "DistContext",
    "all_reduce_max",
    "all_reduce_sum",
    "init_distributed",
    "sum_over_dp",
    "to_local_full",
]


@dataclass(frozen=True)
class DistContext:
    """Where this engine runs: rank, world size, compute device and (with world > 1) its device mesh."""

    rank: int
    world: int
    device: torch.device
    mesh: DeviceMesh | None
    sp_mesh: DeviceMesh | None = None
    """With sequence parallelism: the ("dp", "sp") mesh whose "sp" groups share rows."""
    tp_mesh: DeviceMesh | None = None
    """With tensor parallelism: the ("dp", "tp") mesh whose "tp" groups share rows and split layers."""
    ep_mesh: DeviceMesh | None = None
    """With expert parallelism: the ("edp", "ep") mesh whose "ep" groups split each layer's experts."""

    @property
    def sharded(self) -> bool:
        """True when parameters are sharded over ranks."""
        return self.world > 1

    @property
    def sp(self) -> int:
        """Ranks per sequence group (1 without sequence parallelism)."""
        return 1 if self.sp_mesh is None else int(self.sp_mesh.size(1))

    @property
    def tp(self) -> int:
        """Ranks per tensor group (1 without tensor parallelism)."""
        return 1 if self.tp_mesh is None else int(self.tp_mesh.size(1))

    @property
    def ep(self) -> int:
        """Ranks per expert group (1 without expert parallelism)."""
        return 1 if self.ep_mesh is None else int(self.ep_mesh.size(1))

    @property
    def dp(self) -> int:
        """Data-parallel size: the number of sequence (or tensor) groups."""
        return self.world // (self.sp * self.tp)

    @property
    def loss_factor(self) -> int:
        """What each loss is multiplied by before backward to undo FSDP's mean (see the module doc)."""
        return self.world // self.tp

    def group(self, dim: str) -> Any:
        """The process group of this rank along "dp", "sp", "tp", "edp" or "ep" (None: the whole world)."""
        for mesh in (self.sp_mesh, self.tp_mesh, self.ep_mesh):
            if mesh is not None and dim in (mesh.mesh_dim_names or ()):
                return mesh.get_group(dim)
        return None


def _device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        # Ray gives each actor its own GPU through CUDA_VISIBLE_DEVICES (one visible device, index 0) while
        # a torchrun-style launcher shows all GPUs of the node: LOCAL_RANK modulo the visible count fits both.
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def init_distributed(timeout_s: float = 600.0, sp: int = 1, tp: int = 1, ep: int = 1) -> DistContext:
    """The process group from the environment (initialised here if needed) and the device to compute on.

    With `sp` > 1 the ranks also form the ("dp", "sp") mesh of sequence parallelism, with `tp` > 1 the
    ("dp", "tp") mesh of tensor parallelism, with `ep` > 1 the ("edp", "ep") mesh of expert parallelism.
    The sizes were checked on their own by the spec; here they are checked against the ranks
    (`config.parallel.pool_problems`)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    device = _device(int(os.environ.get("LOCAL_RANK", "0")))
    problems = pool_problems(sp, tp, world, "this engine's pool (the role's ranks)", ep=ep)
    if problems:
        raise problems[0].under("model")
    if world <= 1:
        return DistContext(rank=0, world=1, device=device, mesh=None)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    sp_mesh = None
    if sp > 1:  # row-major: sp consecutive ranks per sequence group
        sp_mesh = init_device_mesh(device.type, (world // sp, sp), mesh_dim_names=("dp", "sp"))
    tp_mesh = None
    if tp > 1:  # row-major: tp consecutive ranks per tensor group
        tp_mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    ep_mesh = None
    if ep > 1:  # row-major: ep consecutive ranks per expert group
        ep_mesh = init_device_mesh(device.type, (world // ep, ep), mesh_dim_names=("edp", "ep"))
    rank = dist.get_rank()
    return DistContext(
        rank=rank, world=world, device=device, mesh=mesh, sp_mesh=sp_mesh, tp_mesh=tp_mesh, ep_mesh=ep_mesh
    )


def all_reduce_sum(values: list[int], ctx: DistContext) -> list[int]:
    """Element-wise sum of small integer counts over data-parallel ranks (a sequence/tensor group once)."""
    if ctx.dp == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=ctx.group("dp"))
    return [int(x) for x in t.tolist()]


def sum_over_dp(value: float, ctx: DistContext) -> float:
    """Sum of a float over data-parallel ranks (the ranks of a sequence or tensor group hold the same one)."""
    if ctx.dp == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=ctx.group("dp"))
    return float(t.item())


def all_reduce_max(value: int, ctx: DistContext) -> int:
    """Maximum of an integer over ranks."""
    if not ctx.sharded:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def to_local_full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full value (a collective: every rank must call it); plain tensors unchanged."""
    return t.full_tensor() if isinstance(t, DTensor) else t
