"""A 2-rank FSDP2 actor update (gloo, in Ray actors), data or sequence parallel, equals a 1-rank update on
the same 8 responses."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from role_cases import rl_batch
from transformers import AutoModelForCausalLM

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.runtime import launch
from quartet.config import ActorConfig, Backend, ClusterConfig
from quartet.core.batch import Batch
from quartet.roles.actor import Actor
from quartet.roles.run_values import RunValues

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _updated_model(actor: Any, batch: Batch, folder: Path) -> tuple[dict[str, torch.Tensor], float]:
    old = actor.compute_logprobs(batch)
    metrics = actor.update(batch.union(old.select("old_logprobs")))
    actor.export_hf(str(folder))
    return AutoModelForCausalLM.from_pretrained(folder).state_dict(), metrics[0]["actor/grad_norm"]


@pytest.mark.parametrize(("sp", "tp"), [(1, 1), (2, 1), (1, 2)], ids=["dp2", "sp2", "tp2"])
def test_two_rank_update_equals_one_rank_update(
    ray_cluster: None,
    actor_config: ActorConfig,
    run_values: RunValues,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sp: int,
    tp: int,
) -> None:
    """dp2: FSDP2 over two ranks; sp2: one sequence group of two ranks (Ulysses, packed), against one rank
    on the packed path; tp2: one tensor group of two ranks (padded). The rows reach the ranks through the
    role's dispatch, as in a run."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "0" if key != "WORLD_SIZE" else "1")
    batch = rl_batch(8, seed=4)
    # Adam's first step is lr * sign(g) whatever the gradient's scale; a large eps makes the step
    # proportional to the gradient, so a wrong factor between ranks would show in the parameters too.
    optim = dataclasses.replace(actor_config.optim, eps=1.0, lr=0.1, weight_decay=0.0, grad_clip=1e6)
    actor = dataclasses.replace(actor_config, optim=optim)
    if sp > 1:
        run_values = dataclasses.replace(run_values, remove_padding=True)
    spec = RoleSpec(Actor, actor, run_values)
    parallel_values = dataclasses.replace(run_values, sequence_parallel_size=sp, tensor_parallel_size=tp)
    parallel = RoleSpec(Actor, actor, parallel_values)
    pool = ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=60).create()
    two = colocate(pool, RunNames("quartet-tests", f"fsdp2-sp{sp}-tp{tp}"), actor=parallel)
    try:
        sharded, norm_two = _updated_model(two.groups["actor"], batch, tmp_path / "two")
    finally:
        two.shutdown()
    one = launch(ClusterConfig(backend=Backend.LOCAL), RunNames("l", "one"), actor=spec)
    try:
        single, norm_one = _updated_model(one.groups["actor"], batch, tmp_path / "one")
    finally:
        one.shutdown()
    assert norm_two == pytest.approx(norm_one, rel=1e-5)  # the same gradient, not a rescaled one
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = [k for k in single if not torch.equal(single[k], start[k])]
    assert len(moved) > len(single) // 2  # the update really changed the model
    for key, value in single.items():
        assert torch.allclose(sharded[key], value, atol=2e-6, rtol=1e-5), key
