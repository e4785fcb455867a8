"""What the tensor- and expert-parallel workers record of one case, the same way for both meshes: the
forward, the gradients of one pass, one optimizer step, the full parameters and the weights the rollout
would receive, and (first case) the HF export and a checkpoint round trip. The test compares them with one
process on all the rows."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from sp_worker import MICRO, TEMPERATURE, full_batch, pg_entropy_loss

from quartet.core.batch import Batch
from quartet.engines import TrainingEngine
from quartet.engines.dist import to_local_full
from quartet.engines.hf_modules import hf_model
from quartet.engines.inputs import build_inputs
from quartet.engines.loss_scale import loss_scale
from quartet.engines.router import routing
from quartet.engines.tensor_parallel import clip_grad_norm
from quartet.engines.ulysses import group_rows
from quartet.engines.weight_export import inference_weights


def gradients(engine: TrainingEngine, batch: Batch) -> tuple[dict[str, torch.Tensor], float]:
    """The parameter gradients of one pass's loss (an MoE's router terms included), scaled and reduced as
    `train_step` does, and their norm. The pass is one micro-batch of the rows of this rank's group."""
    engine.module.train()
    batch, _ = group_rows(batch, engine._row_group)
    scale = loss_scale(batch, engine.ctx)
    inputs = build_inputs(batch)
    with routing(engine._router, inputs, engine.spec.packs) as routed:
        outputs = engine._run(batch, inputs, TEMPERATURE, True)
    loss, metrics = pg_entropy_loss(outputs, batch, scale)
    if engine._router is not None:  # MoE: the router's terms as train_step adds them (0 without coefficients)
        loss, _ = engine._router.add(loss, metrics, routed, scale)
    torch.autograd.backward(loss * engine.ctx.loss_factor)
    params = list(hf_model(engine.module).named_parameters())
    grads = {name: to_local_full(p.grad).detach().clone() for name, p in params if p.grad is not None}
    norm = clip_grad_norm([p for _, p in params], float("inf"))
    engine.optimizer.zero_grad(set_to_none=True)  # type: ignore[union-attr]
    return grads, norm


def full_params(engine: TrainingEngine) -> dict[str, torch.Tensor]:
    """Every parameter gathered whole (DTensors to their full tensors)."""
    return {k: to_local_full(v).detach().clone() for k, v in hf_model(engine.module).state_dict().items()}


def round_trip(engine: TrainingEngine, mine: Batch, folder: Path) -> bool:
    """Save a checkpoint, take another step, load it: the parameters must be those that were saved."""
    saved = full_params(engine)
    engine.save(folder)
    engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
    moved = any(not torch.equal(saved[k], v) for k, v in full_params(engine).items())
    engine.load(folder)
    back = full_params(engine)
    return moved and all(torch.equal(saved[k], back[k]) for k in saved)


def record_case(
    engine: TrainingEngine, mine: Batch, index: int, rank: int, out_dir: Path, results: dict[str, Any]
) -> None:
    """Case `index` on this rank's rows `mine`: its forward to `fwd<index>_rank<rank>.pt`, its metrics to
    `results`, and from rank 0 the gradients and parameters (`grads<index>.pt`, `params<index>.pt`)."""
    logprobs, entropy = engine.forward_logprobs(mine, TEMPERATURE, MICRO, with_entropy=True)
    torch.save({"logprobs": logprobs, "entropy": entropy}, out_dir / f"fwd{index}_rank{rank}.pt")
    grads, norm = gradients(engine, mine)
    metrics = engine.train_step(mine, pg_entropy_loss, MICRO, with_entropy=True)
    results[str(index)] = {**metrics, "pass_grad_norm": norm}
    params = full_params(engine)
    exported = {name: t.detach().clone() for name, t in inference_weights(engine.module)}
    if index == 0:
        engine.export_hf(out_dir / "hf")  # rank 0 writes the consolidated transformers folder
        results[str(index)]["round_trip"] = float(round_trip(engine, mine, out_dir / "ckpt"))
    if rank == 0:
        torch.save(grads, out_dir / f"grads{index}.pt")
        torch.save({"params": params, "exported": exported}, out_dir / f"params{index}.pt")


def compare_with_one_process(
    out: Path, single: TrainingEngine, index: int, world: int, sane: Callable[[dict[str, torch.Tensor]], bool]
) -> None:
    """Case `index`'s records in `out` (written by `world` ranks through `record_case`) against `single`,
    one process on all the rows: forward, one pass's gradients (`sane` checks they are worth comparing),
    one step's loss and norm, then the parameters and the exported weights."""
    batch = full_batch()
    want_lp, want_ent = single.forward_logprobs(batch, TEMPERATURE, MICRO, with_entropy=True)
    got = [torch.load(out / f"fwd{index}_rank{rank}.pt") for rank in range(world)]  # each rank: its rows
    torch.testing.assert_close(torch.cat([g["logprobs"] for g in got]), want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat([g["entropy"] for g in got]), want_ent, atol=1e-5, rtol=0)
    want_grads, want_norm = gradients(single, batch)
    got_grads = torch.load(out / f"grads{index}.pt")
    assert set(got_grads) == set(want_grads)
    assert sane(want_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)
    got_metrics = json.loads((out / "metrics.json").read_text())[str(index)]
    assert got_metrics["pass_grad_norm"] == pytest.approx(want_norm, rel=1e-5)
    metrics = single.train_step(batch, pg_entropy_loss, MICRO, with_entropy=True)
    assert got_metrics["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
    assert got_metrics["grad_norm"] == pytest.approx(metrics["grad_norm"], rel=1e-5)
    saved = torch.load(out / f"params{index}.pt")
    for name, value in hf_model(single.module).state_dict().items():
        torch.testing.assert_close(saved["params"][name], value, atol=1e-6, rtol=1e-5, msg=name)
    named = dict(hf_model(single.module).named_parameters())
    assert set(saved["exported"]) == set(named)
    for name, value in named.items():
        torch.testing.assert_close(saved["exported"][name], value.detach(), atol=1e-6, rtol=1e-5, msg=name)
