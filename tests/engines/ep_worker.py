"""One rank of the expert-parallel exactness test (spawned by test_expert_parallel_dist.py), and the mutants
that the test must see fail.

Rows are dealt over the whole world, unevenly (as the trainer deals them): with world 2, rank 1 has one
micro-batch fewer and runs a dummy one, whose all-to-alls keep it in step. Each case is
(variant, ep, sp, model folder): variant "packed" or "padded" (`remove_padding`), "ckpt" (packed, with
gradient checkpointing: the backward replays each layer's all-to-alls), "router" (packed, the router's
aux and z-loss on: with sp = world, where one process cuts the same micro-batches), or a mutant (packed):

    drop       every all-to-all loses the chunk bound for the last rank of the group (zeros arrive)
    swap       the ranks of an expert group hold each other's experts, while tokens are sent as before
    unweighted the experts' outputs are summed over k without the router's top-k weights
    unscaled   the experts' gradients are not divided by ep (FSDP's mean over "edp" alone leaves them ep x)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from mesh_worker import record_case
from sp_worker import OPTIM, full_batch, rank_rows

from quartet.config.model import Dtype
from quartet.engines import EngineSpec, ModelKind, TrainingEngine, expert_parallel

Case = tuple[str, int, int, str]
"""(variant, ep, sp, model folder)."""


def make_engine(
    model_dir: str, ep: int, sp: int = 1, packed: bool = True, ckpt: bool = False, router: bool = False
) -> TrainingEngine:
    spec = EngineSpec(
        model_dir,
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OPTIM,
        remove_padding=packed,
        sequence_parallel_size=sp,
        expert_parallel_size=ep,
        fused_head=False,
        gradient_checkpointing=ckpt,
        # the router's loss is a mean per micro-batch, and one process cuts other micro-batches than the
        # ranks do: off here, so the comparison isolates the dispatch (tests/engines/test_moe_fsdp.py
        # checks the router loss with matching micro-batches), except for "router": sp = world, so the
        # sequence group's micro-batches are one process's (tests/engines/test_moe_sp_dist.py for more)
        moe_aux_loss_coef=0.5 if router else 0.0,
        moe_z_loss_coef=0.1 if router else 0.0,
    )
    return TrainingEngine(spec)


@contextmanager
def mutant(variant: str) -> Iterator[None]:
    """`expert_parallel` with the named bug for the duration of the block (none for a plain variant)."""
    saved = {n: getattr(expert_parallel, n) for n in ("all_to_all", "expert_slice", "combine", "scale_grad")}
    all_to_all, expert_slice = saved["all_to_all"], saved["expert_slice"]

    def dropping(x: torch.Tensor, send: list[int], recv: list[int], group: object) -> torch.Tensor:
        kept = torch.cat([x[: sum(send[:-1])], torch.zeros_like(x[sum(send[:-1]) :])])
        return all_to_all(kept, send, recv, group)  # type: ignore[operator]

    def swapped(num_experts: int, size: int, rank: int) -> tuple[int, int]:
        return expert_slice(num_experts, size, size - 1 - rank)  # type: ignore[operator, no-any-return]

    def unweighted(pairs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return pairs.sum(dim=1)

    def unscaled(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x

    bugs = {
        "drop": ("all_to_all", dropping),
        "swap": ("expert_slice", swapped),
        "unweighted": ("combine", unweighted),
        "unscaled": ("scale_grad", unscaled),
    }
    if variant in bugs:
        name, bug = bugs[variant]
        setattr(expert_parallel, name, bug)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(expert_parallel, name, value)


def run_rank(rank: int, world: int, port: int, cases: list[Case], out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    out_dir = Path(out)
    results: dict[str, dict[str, float]] = {}
    for index, (variant, ep, sp, path) in enumerate(cases):
        with mutant(variant):
            packed, ckpt, router = variant != "padded", variant == "ckpt", variant == "router"
            engine = make_engine(path, ep, sp, packed=packed, ckpt=ckpt, router=router)
            assert engine.ctx.ep == ep and engine.ctx.dp == world // sp
            mine = rank_rows(full_batch(), rank, world)
            record_case(engine, mine, index, rank, out_dir, results)
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
