"""One rank of the two-rank FSDP2 test of a vision-language model (spawned by test_vision_fsdp.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.spec import LossScale, ModelOutputs

MICRO = MicroSpec(max_tokens=80)
OPTIM = OptimConfig(lr=0.5, eps=1.0, weight_decay=0.0, grad_clip=0.0)  # first Adam step ~ the gradient


def logprob_loss(
    outputs: ModelOutputs, mb: Batch, scale: LossScale
) -> tuple[torch.Tensor, Mapping[str, float]]:
    """-sum(logprob) / global tokens: a token-mean loss whose gradient accumulates exactly over ranks."""
    assert outputs.logprobs is not None
    valid = mb["response_mask"] != 0
    return -torch.where(valid, outputs.logprobs, 0.0).sum() / scale.tokens, {}


def make_engine(model_dir: str, freeze: bool) -> TrainingEngine:
    spec = EngineSpec(model_dir, ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=OPTIM, freeze_vision_tower=freeze)
    return TrainingEngine(spec)


def rank_rows(batch: Batch, rank: int) -> Batch:
    half = len(batch) // 2 + 1  # uneven halves: ranks differ in micro-batch counts
    return batch.slice(0, half) if rank == 0 else batch.slice(half, len(batch))


def run_rank(rank: int, world: int, port: int, model_dir: str, batch_file: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    mine = rank_rows(torch.load(batch_file, weights_only=False), rank)
    out_dir, results = Path(out), {}
    for freeze in (True, False):
        engine = make_engine(model_dir, freeze)
        assert engine.ctx.sharded
        logprobs, _ = engine.forward_logprobs(mine, 1.0, MicroSpec(size=2))
        torch.save(logprobs, out_dir / f"logprobs_{freeze}_rank{rank}.pt")
        results[str(freeze)] = engine.train_step(mine, logprob_loss, MICRO)
        engine.export_hf(out_dir / f"hf_{freeze}")
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
