"""One rank of the tensor-parallel exactness test (spawned by test_tensor_parallel_dist.py), and the helpers
that compute the same quantities on one process.

Rows are dealt over the whole world, unevenly (as the trainer deals them); the engine pools the rows of a
tensor group itself. Each entry of `model_dirs` is "<variant>:<folder>": variant "packed" or "padded"
(`remove_padding`), or "mutant" (packed, with the all-reduce of the sum of exponentials left out, which
the test must notice).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from mesh_worker import record_case
from sp_worker import OPTIM, full_batch, rank_rows

from quartet.config.model import Dtype
from quartet.engines import EngineSpec, ModelKind, TrainingEngine, vocab_parallel


def make_engine(model_dir: str, tp: int, packed: bool) -> TrainingEngine:
    spec = EngineSpec(
        model_dir,
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OPTIM,
        remove_padding=packed,
        tensor_parallel_size=tp,
        fused_head=False,
    )
    return TrainingEngine(spec)


def _skip_sumexp_reduction() -> None:
    """The mutation: each rank's log-sum-exp over its own vocabulary slice only."""

    def local_lse(z: torch.Tensor, reduce: vocab_parallel.VocabReduce) -> torch.Tensor:
        m = reduce.max(z.max(dim=-1).values).detach()
        return m + torch.log(torch.exp(z - m.unsqueeze(-1)).sum(dim=-1))

    vocab_parallel._lse = local_lse  # type: ignore[assignment]


def run_rank(rank: int, world: int, tp: int, port: int, model_dirs: list[str], out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    out_dir = Path(out)
    results: dict[str, dict[str, float]] = {}
    for index, entry in enumerate(model_dirs):
        variant, _, path = entry.partition(":")
        if variant == "mutant":
            _skip_sumexp_reduction()
        engine = make_engine(path, tp, packed=variant != "padded")
        assert engine.ctx.tp == tp and engine.ctx.dp == world // tp and not engine.fused_head
        mine = rank_rows(full_batch(), rank, world)
        record_case(engine, mine, index, rank, out_dir, results)
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
