"""One rank of the two-rank FSDP2 test (started by torch.multiprocessing spawn from test_fsdp.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from engine_cases import make_batch, pg_loss, seq_mean_loss

from quartet.config.model import Dtype, LoraConfig
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine

PROMPTS = [5, 2, 7, 1, 4, 6, 3, 2]
RESPONSES = [3, 6, 1, 4, 2, 5, 2, 6]
SPLIT = 5  # rank 0 gets rows 0..4, rank 1 rows 5..7: uneven, so ranks differ in micro-batch counts
MICRO = MicroSpec(max_tokens=12)
# eps >> |grad|: Adam's first step is proportional to the gradient (see test_train_step.py).
OPTIM = OptimConfig(lr=0.5, eps=1.0, weight_decay=0.0, grad_clip=0.0)
LOSSES = {"token": pg_loss, "seq": seq_mean_loss}


def full_batch() -> Batch:
    return make_batch(PROMPTS, RESPONSES)


def rank_rows(rank: int) -> Batch:
    batch = full_batch()
    return batch.slice(0, SPLIT) if rank == 0 else batch.slice(SPLIT, len(batch))


LORA = LoraConfig(rank=4, alpha=8, target_modules=("q_proj", "v_proj", "down_proj"))


def make_engine(model_dir: str, lora: LoraConfig | None = None, fused: bool = False) -> TrainingEngine:
    spec = EngineSpec(model_dir, ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=OPTIM, lora=lora, fused_head=fused)
    return TrainingEngine(spec)


def make_reward_engine(reward_dir: str) -> TrainingEngine:
    return TrainingEngine(EngineSpec(reward_dir, ModelKind.REWARD, Dtype.FLOAT32))


def run_rank(rank: int, world: int, port: int, model_dir: str, reward_dir: str, out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    out_dir = Path(out)
    mine = rank_rows(rank)
    results = {}
    for name, loss_fn in LOSSES.items():
        engine = make_engine(model_dir)
        assert engine.ctx.world == world and engine.ctx.sharded
        results[name] = engine.train_step(mine, loss_fn, MICRO)
        engine.export_hf(out_dir / f"hf_{name}")
        if name == "token":
            engine.save(out_dir / "ckpt")
            logprobs, _ = engine.forward_logprobs(mine, 1.0, MicroSpec(size=1))
            torch.save(logprobs, out_dir / f"logprobs_rank{rank}.pt")
    fused = make_engine(model_dir, fused=True)  # the lm_head (tied to the embeddings) sharded at the root
    assert fused.fused_head
    results["fused"] = fused.train_step(mine, pg_loss, MICRO)
    torch.save(
        fused.forward_logprobs(mine, 0.7, MicroSpec(size=2))[0], out_dir / f"fused_logprobs_rank{rank}.pt"
    )
    fused.export_hf(out_dir / "hf_fused")
    lora = make_engine(model_dir, LORA)
    results["lora"] = lora.train_step(mine, pg_loss, MICRO)
    lora.export_hf(out_dir / "hf_lora")
    scores = make_reward_engine(reward_dir).forward_scores(mine, MicroSpec(size=2))
    torch.save(scores, out_dir / f"scores_rank{rank}.pt")
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
