"""One rank of the two-rank FSDP2 test of a vision-language critic (spawned by test_vision_critic_fsdp.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from fsdp_vlm_worker import OPTIM, rank_rows

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.spec import LossScale, ModelOutputs

MICRO = MicroSpec(size=2)  # rank 1's first micro-batch holds rows 7 and 8, neither with an image


def value_loss(
    outputs: ModelOutputs, mb: Batch, scale: LossScale
) -> tuple[torch.Tensor, Mapping[str, float]]:
    """sum((value - 0.5)^2) / global tokens: a token mean whose gradient accumulates exactly over ranks."""
    assert outputs.values is not None
    valid = mb["response_mask"] != 0
    return torch.where(valid, (outputs.values - 0.5) ** 2, 0.0).sum() / scale.tokens, {}


def make_critic(value_dir: str) -> TrainingEngine:
    spec = EngineSpec(value_dir, ModelKind.VALUE, Dtype.FLOAT32, optim=OPTIM, freeze_vision_tower=False)
    return TrainingEngine(spec)


def run_rank(rank: int, world: int, port: int, value_dir: str, batch_file: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    mine = rank_rows(torch.load(batch_file, weights_only=False), rank)
    out_dir = Path(out)
    engine = make_critic(value_dir)
    assert engine.ctx.sharded
    torch.save(engine.forward_values(mine, MICRO), out_dir / f"values_rank{rank}.pt")
    metrics = engine.train_step(mine, value_loss, MICRO)
    engine.export_hf(out_dir / "hf")
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(metrics))
    dist.barrier()
    dist.destroy_process_group()
