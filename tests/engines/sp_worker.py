"""One rank of the sequence-parallel exactness test (spawned by test_ulysses_dist.py), and the helpers that
compute the same quantities on one process.

Rows are dealt over the whole world, unevenly (as the trainer deals them); the engine pools the rows of
a sequence group itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from engine_cases import make_batch

from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch
from quartet.core.loss_agg import count_valid_sequences, count_valid_tokens
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine
from quartet.engines.dist import all_reduce_sum, to_local_full
from quartet.engines.hf_modules import hf_model
from quartet.engines.inputs import build_inputs
from quartet.engines.ulysses import group_rows, heads_to_seq, seq_group, seq_to_heads

# Rows of different lengths; packed micro-batches of 4 rows hold 29 and 30 tokens (odd: padding is used).
PROMPTS = [5, 2, 7, 1, 4, 6, 3, 2]
RESPONSES = [3, 6, 1, 4, 2, 5, 2, 6]
MICRO = MicroSpec(size=4)
# eps >> |grad|: Adam's first step is proportional to the gradient (see test_train_step.py).
OPTIM = OptimConfig(lr=0.5, eps=1.0, weight_decay=0.0, grad_clip=0.0)
TEMPERATURE = 0.7


def full_batch() -> Batch:
    return make_batch(PROMPTS, RESPONSES)


def pg_entropy_loss(
    outputs: ModelOutputs, mb: Batch, scale: LossScale
) -> tuple[torch.Tensor, Mapping[str, float]]:
    """Token-mean of -advantage * logprob - 0.1 * entropy over the global token count."""
    assert outputs.logprobs is not None and outputs.entropy is not None
    valid = mb["response_mask"] != 0
    per_token = -mb["advantages"] * outputs.logprobs - 0.1 * outputs.entropy
    return torch.where(valid, per_token, 0.0).sum() / scale.tokens, {}


def make_engine(model_dir: str, sp: int, fused: bool = False, ckpt: bool = False) -> TrainingEngine:
    spec = EngineSpec(
        model_dir,
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OPTIM,
        remove_padding=True,
        sequence_parallel_size=sp,
        fused_head=fused,
        gradient_checkpointing=ckpt,
    )
    return TrainingEngine(spec)


def gradients(engine: TrainingEngine, batch: Batch) -> dict[str, torch.Tensor]:
    """The parameter gradients of one micro-batch's loss, scaled and reduced as `train_step` does."""
    engine.module.train()
    batch, _ = group_rows(batch, seq_group(engine.ctx))
    mask = batch["response_mask"]
    tokens, seqs = all_reduce_sum([count_valid_tokens(mask), count_valid_sequences(mask)], engine.ctx)
    scale = LossScale(tokens=tokens, sequences=seqs, dp_size=engine.ctx.dp)
    outputs = engine._run(batch, build_inputs(batch), TEMPERATURE, True)
    loss, _ = pg_entropy_loss(outputs, batch, scale)
    torch.autograd.backward(loss * engine.ctx.world)
    named = hf_model(engine.module).named_parameters()
    grads = {name: to_local_full(p.grad).detach().clone() for name, p in named if p.grad is not None}
    engine.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    return grads


SPLITS = {1: (0, 8), 2: (0, 5, 8), 4: (0, 3, 4, 6, 8)}
"""Row boundaries per world size: uneven shares, so ranks differ in rows and micro-batch counts."""


def rank_rows(batch: Batch, rank: int, world: int) -> Batch:
    return batch.slice(SPLITS[world][rank], SPLITS[world][rank + 1])


def layout_check(out: Path, rank: int, sp_rank: int, group: object) -> None:
    """seq_to_heads / heads_to_seq on a known tensor: saved for the test to compare with a direct split."""
    full = torch.arange(6 * 4 * 3, dtype=torch.float32).reshape(6, 4, 3)
    local = full.chunk(2)[sp_rank]
    heads = seq_to_heads(local, group)  # type: ignore[arg-type]
    torch.save({"heads": heads, "back": heads_to_seq(heads, group)}, out / f"layout_rank{rank}.pt")  # type: ignore[arg-type]


def run_rank(rank: int, world: int, sp: int, port: int, model_dirs: list[str], out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    out_dir = Path(out)
    results: dict[str, dict[str, float]] = {}
    for index, model_dir in enumerate(model_dirs):
        # "fused:<dir>": the fused lm_head (on by default on CUDA) computes the local tokens' outputs;
        # "ckpt:<dir>": gradient checkpointing replays the forward, all-to-alls included, in the backward
        variant, _, path = model_dir.rpartition(":")
        engine = make_engine(path, sp, fused=variant == "fused", ckpt=variant == "ckpt")
        assert engine.fused_head == (variant == "fused")
        group = seq_group(engine.ctx)
        assert group is not None and group.size == sp and engine.ctx.dp == world // sp
        mine = rank_rows(full_batch(), rank, world)
        if index == 0 and world == sp:
            layout_check(out_dir, rank, group.rank, group)
        logprobs, entropy = engine.forward_logprobs(mine, TEMPERATURE, MICRO, with_entropy=True)
        torch.save({"logprobs": logprobs, "entropy": entropy}, out_dir / f"fwd{index}_rank{rank}.pt")
        grads = gradients(engine, mine)
        if rank == 0:
            torch.save(grads, out_dir / f"grads{index}.pt")
        results[str(index)] = engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
        params = {
            k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()
        }
        if rank == 0:
            torch.save(params, out_dir / f"params{index}.pt")
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
