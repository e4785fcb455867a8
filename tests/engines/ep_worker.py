"""One rank of the expert-parallel exactness test (spawned by test_expert_parallel_dist.py), and the mutants
that the test must see fail.

Rows are dealt over the whole world, unevenly (as the trainer deals them): with world 2, rank 1 has one
micro-batch fewer and runs a dummy one, whose all-to-alls keep it in step. Each case is
(variant, ep, sp, model folder): variant "packed" or "padded" (`remove_padding`), "ckpt" (packed, with
gradient checkpointing: the backward replays each layer's all-to-alls), or a mutant (packed):

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
from sp_worker import MICRO, OPTIM, TEMPERATURE, full_batch, pg_entropy_loss, rank_rows

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.core.loss_agg import count_valid_sequences, count_valid_tokens
from quartet.engines import EngineSpec, LossScale, ModelKind, TrainingEngine, expert_parallel
from quartet.engines.dist import all_reduce_sum, to_local_full
from quartet.engines.hf_modules import hf_model
from quartet.engines.inputs import build_inputs
from quartet.engines.tensor_parallel import clip_grad_norm
from quartet.engines.ulysses import group_rows
from quartet.engines.weight_export import inference_weights

Case = tuple[str, int, int, str]
"""(variant, ep, sp, model folder)."""


def make_engine(
    model_dir: str, ep: int, sp: int = 1, packed: bool = True, ckpt: bool = False
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
        # checks the router loss with matching micro-batches)
        moe_aux_loss_coef=0.0,
    )
    return TrainingEngine(spec)


def gradients(engine: TrainingEngine, batch: Batch) -> tuple[dict[str, torch.Tensor], float]:
    """The parameter gradients of one pass's loss, scaled and reduced as `train_step` does, and their norm."""
    engine.module.train()
    batch, _ = group_rows(batch, engine._row_group)
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


def full_params(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    return {k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()}


def _round_trip(engine: TrainingEngine, mine: Batch, folder: Path) -> bool:
    """Save a checkpoint, take another step, load it: the parameters must be those that were saved."""
    saved = full_params(engine)
    engine.save(folder)
    engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
    moved = any(not torch.equal(saved[k], v) for k, v in full_params(engine).items())
    engine.load(folder)
    back = full_params(engine)
    return moved and all(torch.equal(saved[k], back[k]) for k in saved)


def run_rank(rank: int, world: int, port: int, cases: list[Case], out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    out_dir = Path(out)
    results: dict[str, dict[str, float]] = {}
    for index, (variant, ep, sp, path) in enumerate(cases):
        with mutant(variant):
            engine = make_engine(path, ep, sp, packed=variant != "padded", ckpt=variant == "ckpt")
            assert engine.ctx.ep == ep and engine.ctx.dp == world // sp
            mine = rank_rows(full_batch(), rank, world)
            logprobs, entropy = engine.forward_logprobs(mine, TEMPERATURE, MICRO, with_entropy=True)
            torch.save({"logprobs": logprobs, "entropy": entropy}, out_dir / f"fwd{index}_rank{rank}.pt")
            grads, norm = gradients(engine, mine)
            metrics = engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
            results[str(index)] = {**metrics, "pass_grad_norm": norm}
            params = full_params(engine)
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
