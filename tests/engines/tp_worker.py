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
from sp_worker import MICRO, OPTIM, TEMPERATURE, full_batch, pg_entropy_loss, rank_rows

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.core.loss_agg import count_valid_sequences, count_valid_tokens
from quartet.engines import EngineSpec, LossScale, ModelKind, TrainingEngine, vocab_parallel
from quartet.engines.dist import all_reduce_sum, to_local_full
from quartet.engines.hf_modules import hf_model
from quartet.engines.inputs import build_inputs
from quartet.engines.tensor_parallel import clip_grad_norm, row_group
from quartet.engines.ulysses import group_rows
from quartet.engines.weight_export import inference_weights


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


def gradients(engine: TrainingEngine, batch: Batch) -> tuple[dict[str, torch.Tensor], float]:
    """The parameter gradients of one pass's loss, scaled and reduced as `train_step` does, and their norm."""
    engine.module.train()
    batch, _ = group_rows(batch, row_group(engine.ctx))
    mask = batch["response_mask"]
    tokens, seqs = all_reduce_sum([count_valid_tokens(mask), count_valid_sequences(mask)], engine.ctx)
    scale = LossScale(tokens=tokens, sequences=seqs, dp_size=engine.ctx.dp)
    outputs = engine._run(batch, build_inputs(batch), TEMPERATURE, True)
    loss, _ = pg_entropy_loss(outputs, batch, scale)
    torch.autograd.backward(loss * engine.ctx.loss_factor)
    params = list(hf_model(engine.module).named_parameters())
    grads = {name: to_local_full(p.grad).detach().clone() for name, p in params if p.grad is not None}
    norm = clip_grad_norm([p for _, p in params], float("inf"))
    engine.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    return grads, norm


def _skip_sumexp_reduction() -> None:
    """The mutation: each rank's log-sum-exp over its own vocabulary slice only."""

    def local_lse(z: torch.Tensor, reduce: vocab_parallel.VocabReduce) -> torch.Tensor:
        m = reduce.max(z.max(dim=-1).values).detach()
        return m + torch.log(torch.exp(z - m.unsqueeze(-1)).sum(dim=-1))

    vocab_parallel._lse = local_lse  # type: ignore[assignment]


def _full_params(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()}


def _round_trip(engine: TrainingEngine, mine: Batch, folder: Path) -> bool:
    """Save a checkpoint, take another step, load it: the parameters must be those that were saved."""
    saved = _full_params(engine)
    engine.save(folder)
    engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
    moved = any(not torch.equal(saved[k], v) for k, v in _full_params(engine).items())
    engine.load(folder)
    back = _full_params(engine)
    return moved and all(torch.equal(saved[k], back[k]) for k in saved)


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
        logprobs, entropy = engine.forward_logprobs(mine, TEMPERATURE, MICRO, with_entropy=True)
        torch.save({"logprobs": logprobs, "entropy": entropy}, out_dir / f"fwd{index}_rank{rank}.pt")
        grads, norm = gradients(engine, mine)
        metrics = engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
        results[str(index)] = {**metrics, "pass_grad_norm": norm}
        params = _full_params(engine)
        exported = {name: t.detach().clone() for name, t in inference_weights(engine.module)}
        if index == 0:
            engine.export_hf(out_dir / "hf")  # rank 0 writes the consolidated transformers folder
            results[str(index)]["round_trip"] = float(_round_trip(engine, mine, out_dir / "ckpt"))
        if rank == 0:
            torch.save(grads, out_dir / f"grads{index}.pt")
            torch.save({"params": params, "exported": exported}, out_dir / f"params{index}.pt")
    if rank == 0:
        (out_dir / "metrics.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
