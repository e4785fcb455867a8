"""One rank of the two-rank FSDP2 MoE test (started by torch.multiprocessing spawn from test_moe_fsdp.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from engine_cases import make_batch, pg_loss

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine

PROMPTS = [5, 2, 7, 1, 4, 6, 3, 2]
RESPONSES = [3, 6, 1, 4, 2, 5, 2, 6]
SPLIT = 4  # rank 0 rows 0..3, rank 1 rows 4..7: micro-batches of 2 rows are those of one process
MICRO = MicroSpec(size=2)
# eps >> |grad|: Adam's first step is proportional to the gradient (see test_train_step.py).
OPTIM = OptimConfig(lr=0.5, eps=1.0, weight_decay=0.0, grad_clip=0.0)


def full_batch() -> Batch:
    return make_batch(PROMPTS, RESPONSES)


def make_engine(model_dir: str, aux: float = 0.5) -> TrainingEngine:
    """The engine of the test; `aux`: the load-balancing coefficient (0 for a model without that loss)."""
    spec = EngineSpec(
        model_dir, ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=OPTIM, moe_aux_loss_coef=aux, moe_z_loss_coef=0.1
    )
    return TrainingEngine(spec)


def run_rank(rank: int, world: int, port: int, model_dir: str, out: str, aux: float = 0.5) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    batch = full_batch()
    mine = batch.slice(0, SPLIT) if rank == 0 else batch.slice(SPLIT, len(batch))
    engine = make_engine(model_dir, aux)
    assert engine.ctx.world == world and engine.ctx.sharded
    metrics = engine.train_step(mine, pg_loss, MICRO)
    engine.export_hf(Path(out) / "hf")
    (Path(out) / f"metrics_rank{rank}.json").write_text(json.dumps(metrics))
    dist.barrier()
    dist.destroy_process_group()
