"""One rank of the MoE sequence-parallel exactness test (spawned by test_moe_sp_dist.py), the same pass on
one process, and the mutant the test must see fail.

The router's load-balancing loss and z-loss are ON (coefficients 0.5 and 0.1). Rows are dealt over the
world unevenly (`sp_worker.rank_rows`); a sequence group pools its ranks' rows, so its micro-batches (4
rows) are those of one process on all the rows (rows 0-3, then 4-7). Each case is (variant, ep, sp, model
folder): "packed" (sp > 1 packs), "ckpt" (and gradient checkpointing), "critic" (a value model on the
MoE trunk, as `critic.sequence_parallel_size` runs it: its values and a squared-error value loss), or the
mutant

    unreduced  each rank forms the router's loss and metrics from its own token slice (the statistics are
               not summed over the sequence group)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from sp_worker import MICRO, OPTIM, TEMPERATURE, full_batch, pg_entropy_loss, rank_rows

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, LossFn, LossScale, ModelKind, ModelOutputs, TrainingEngine, router
from quartet.engines.dist import to_local_full
from quartet.engines.hf_modules import hf_model
from quartet.engines.inputs import build_inputs
from quartet.engines.loss_scale import loss_scale
from quartet.engines.tensor_parallel import clip_grad_norm
from quartet.engines.ulysses import group_rows

Case = tuple[str, int, int, str]
"""(variant, ep, sp, model folder)."""
AUX, Z = 0.5, 0.1


def value_loss(out: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, Mapping[str, float]]:
    """Token-mean of (value - target)^2 over the global token count (the critic's case)."""
    valid = mb["response_mask"] != 0
    per_token = (out.required("values") - mb["targets"]).square()
    return torch.where(valid, per_token, 0.0).sum() / scale.tokens, {}


def loss_of(critic: bool) -> LossFn:
    return value_loss if critic else pg_entropy_loss


def forward(engine: TrainingEngine, batch: Batch) -> dict[str, torch.Tensor | None]:
    """The per-token outputs of `batch`: values for the critic, else log-probs and entropy."""
    if engine.spec.kind is ModelKind.VALUE:
        return {"values": engine.forward_values(batch, MICRO)}
    logprobs, entropy = engine.forward_logprobs(batch, TEMPERATURE, MICRO, with_entropy=True)
    return {"logprobs": logprobs, "entropy": entropy}


def make_engine(
    model_dir: str, sp: int, ep: int = 1, ckpt: bool = False, critic: bool = False
) -> TrainingEngine:
    spec = EngineSpec(
        model_dir,
        ModelKind.VALUE if critic else ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OPTIM,
        remove_padding=True,
        sequence_parallel_size=sp,
        expert_parallel_size=ep,
        fused_head=False,
        gradient_checkpointing=ckpt,
        moe_aux_loss_coef=AUX,
        moe_z_loss_coef=Z,
    )
    return TrainingEngine(spec)


def router_gradients(
    engine: TrainingEngine, batch: Batch, chunks: list[slice] | None = None
) -> tuple[dict[str, torch.Tensor], float, dict[str, float]]:
    """One backward over the micro-batches `chunks` of the (group-pooled) rows, each with its router terms
    as `train_step` adds them; every parameter's gradient gathered whole, their norm, and the router
    metrics of the first micro-batch. `chunks` None: the pooled rows as one micro-batch."""
    engine.module.train()
    batch, _ = group_rows(batch, engine._row_group)
    scale = loss_scale(batch, engine.ctx)
    first: dict[str, float] = {}
    for part in chunks or [slice(0, len(batch))]:
        mb = batch.slice(part.start, part.stop)
        inputs = build_inputs(mb)
        with router.routing(engine._router, inputs, engine.spec.packs) as routed:
            outputs = engine._run(mb, inputs, TEMPERATURE, True)
        loss, metrics = loss_of(engine.spec.kind is ModelKind.VALUE)(outputs, mb, scale)
        assert engine._router is not None
        loss, metrics = engine._router.add(loss, metrics, routed, scale)
        torch.autograd.backward(loss * engine.ctx.loss_factor)
        first = first or {k: float(v) for k, v in metrics.items()}
    params = list(hf_model(engine.module).named_parameters())
    grads = {name: to_local_full(p.grad).detach().clone() for name, p in params if p.grad is not None}
    norm = clip_grad_norm([p for _, p in params], float("inf"))
    engine.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    return grads, norm, first


@contextmanager
def mutant(variant: str) -> Iterator[None]:
    """`engines.router` with the named bug for the duration of the block (none for a plain variant)."""
    saved = router.sum_over_group
    if variant == "unreduced":
        router.sum_over_group = lambda x, group: x  # type: ignore[assignment]
    try:
        yield
    finally:
        router.sum_over_group = saved


def run_rank(rank: int, world: int, port: int, cases: list[Case], out: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0"
    )
    torch.set_num_threads(1)
    out_dir = Path(out)
    results: dict[str, dict[str, Any]] = {}
    for index, (variant, ep, sp, path) in enumerate(cases):
        with mutant(variant):
            critic = variant == "critic"
            engine = make_engine(path, sp, ep, ckpt=variant == "ckpt", critic=critic)
            assert engine.ctx.sp == sp and engine.ctx.ep == ep and engine.ctx.dp == world // sp
            mine = rank_rows(full_batch(), rank, world)
            torch.save(forward(engine, mine), out_dir / f"fwd{index}_rank{rank}.pt")
            grads, norm, pass_metrics = router_gradients(engine, mine)
            step = engine.train_step(mine, loss_of(critic), MICRO, with_entropy=not critic)
            results[str(index)] = {"pass": {**pass_metrics, "grad_norm": norm}, "step": step}
            state = hf_model(engine.module).state_dict()
            params = {k: to_local_full(v).detach().clone() for k, v in state.items()}
            if rank == 0:
                torch.save({"grads": grads, "params": params}, out_dir / f"case{index}.pt")
    (out_dir / f"metrics_rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()
