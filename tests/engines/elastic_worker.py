"""Both halves of the elastic-resume test (test_elastic_resume_dist.py): a world that trains and saves, and
a world of another size or layout that loads what it saved and trains on.

`save_half`: one optimizer step on this rank's rows, a checkpoint, then what the uninterrupted run does next
(one more step: its loss and the parameters after it). `load_half`: a fresh engine loads the checkpoint and
takes that next step. Each writes, from rank 0, every parameter and optimizer state gathered whole and the
scheduler's position (`state_<tag>.pt`), and the next step's loss and parameters (`next_<tag>.pt`); every
rank writes its torch RNG state right after the load (`rng_<tag>_rank<r>.pt`). The rows of the global batch
are dealt to the ranks unevenly (`sp_worker.rank_rows`); the loss is a mean over the global batch, so it
does not depend on the split.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from sp_worker import MICRO, full_batch, pg_entropy_loss, rank_rows
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)

from quartet.config.model import Dtype
from quartet.config.optim import LrSchedule, OptimConfig
from quartet.engines import EngineSpec, ModelKind, TrainingEngine

# A warmup and a cosine schedule, so that a scheduler not carried over changes the next update; eps >>
# |grad| makes the update proportional to the gradient (a near-zero gradient cannot flip its sign).
OPTIM = OptimConfig(
    lr=0.5, eps=1.0, warmup_steps=2, schedule=LrSchedule.COSINE, weight_decay=0.0, grad_clip=0.0
)
SEED = 7

Layout = dict[str, int]
"""{"sp": .., "tp": .., "ep": ..} (1 where absent)."""


def make_engine(model_dir: str, layout: Layout) -> TrainingEngine:
    spec = EngineSpec(
        model_dir,
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OPTIM,
        total_steps=10,
        remove_padding=True,
        sequence_parallel_size=layout.get("sp", 1),
        tensor_parallel_size=layout.get("tp", 1),
        expert_parallel_size=layout.get("ep", 1),
        fused_head=False,
        seed=SEED,
        moe_aux_loss_coef=0.0,
        moe_z_loss_coef=0.0,
    )
    return TrainingEngine(spec)


def full_state(engine: TrainingEngine) -> dict[str, Any]:
    """Every parameter and optimizer state gathered whole onto rank 0 (CPU), and the scheduler's state."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=engine.ctx.sharded)  # one rank: no group
    model = get_model_state_dict(engine.module, options=options)
    optim = get_optimizer_state_dict(engine.module, engine.optimizer, options=options)  # type: ignore[arg-type]
    assert engine.scheduler is not None
    return {"model": model, "optimizer": optim, "scheduler": engine.scheduler.state_dict()}


def _step(engine: TrainingEngine, rank: int, world: int) -> float:
    mine = rank_rows(full_batch(), rank, world)
    return float(engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)["loss"])


def _next(engine: TrainingEngine, rank: int, world: int, out: Path, tag: str) -> None:
    loss = _step(engine, rank, world)
    state = full_state(engine)
    if rank == 0:
        torch.save({"loss": loss, "model": state["model"]}, out / f"next_{tag}.pt")


def save_half(rank: int, world: int, model_dir: str, layout: Layout, out: Path) -> None:
    engine = make_engine(model_dir, layout)
    _step(engine, rank, world)
    engine.save(out / "ckpt")
    state = full_state(engine)
    if rank == 0:
        torch.save(state, out / "state_saved.pt")
    _next(engine, rank, world, out, "saved")


def load_half(rank: int, world: int, model_dir: str, layout: Layout, out: Path) -> None:
    engine = make_engine(model_dir, layout)
    began = time.perf_counter()
    engine.load(out / "ckpt")
    seconds = time.perf_counter() - began
    torch.save(torch.get_rng_state(), out / f"rng_loaded_rank{rank}.pt")
    assert engine.steps == 1
    state = full_state(engine)
    if rank == 0:
        torch.save(state, out / "state_loaded.pt")
        (out / "load_seconds.txt").write_text(f"{seconds:.3f}\n")
    _next(engine, rank, world, out, "loaded")


def run_rank(rank: int, world: int, port: int, half: str, model_dir: str, layout: Layout, out: str) -> None:
    """Spawned: rank `rank` of `world` gloo ranks runs `half` ("save" or "load")."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    (save_half if half == "save" else load_half)(rank, world, model_dir, layout, Path(out))
    dist.barrier()
    dist.destroy_process_group()
