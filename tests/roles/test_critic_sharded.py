"""A 2-rank critic with sequence parallelism (one sequence group, gloo, in Ray actors) computes the same
values and makes the same update as one rank on the padded path, on the same 8 responses: the rows reach
the ranks through the role's dispatch, as in a run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from role_cases import rl_batch
from transformers import AutoModelForTokenClassification

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.runtime import launch
from quartet.config import Backend, ClusterConfig, CriticConfig
from quartet.core.batch import Batch
from quartet.roles.critic import Critic
from quartet.roles.run_values import RunValues

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _values_and_update(critic: Any, batch: Batch, folder: Path) -> tuple[torch.Tensor, float, dict[str, Any]]:
    values = critic.compute_values(batch)["values"]
    returns = torch.linspace(-1.0, 1.0, values.numel()).reshape(values.shape) * batch["response_mask"]
    metrics = critic.update(batch.union(Batch({"values": values, "returns": returns})))[0]  # rank 0's
    critic.export_hf(str(folder))
    model = AutoModelForTokenClassification.from_pretrained(folder)
    return values, metrics["critic/grad_norm"], model.state_dict()


def test_sp2_critic_equals_one_rank(
    ray_cluster: None,
    critic_config: CriticConfig,
    run_values: RunValues,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "0" if key != "WORLD_SIZE" else "1")
    batch = rl_batch(8, seed=5)
    # a large eps makes Adam's first step proportional to the gradient (see test_actor_sharded.py)
    optim = dataclasses.replace(critic_config.optim, eps=1.0, lr=0.1, weight_decay=0.0, grad_clip=1e6)
    critic = dataclasses.replace(critic_config, optim=optim)
    parallel = RoleSpec(Critic, dataclasses.replace(critic, sequence_parallel_size=2), run_values)
    pool = ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=60).create()
    two = colocate(pool, RunNames("quartet-tests", "critic-sp2"), critic=parallel)
    try:
        values_two, norm_two, sharded = _values_and_update(two.groups["critic"], batch, tmp_path / "two")
    finally:
        two.shutdown()
    one = launch(
        ClusterConfig(backend=Backend.LOCAL),
        RunNames("l", "critic-one"),
        critic=RoleSpec(Critic, critic, run_values),
    )
    try:
        values_one, norm_one, single = _values_and_update(one.groups["critic"], batch, tmp_path / "one")
    finally:
        one.shutdown()
    torch.testing.assert_close(values_two, values_one, atol=1e-5, rtol=0)
    assert norm_one > 1e-3 and norm_two == pytest.approx(norm_one, rel=1e-5)  # a real, equal gradient
    for key, value in single.items():
        assert torch.allclose(sharded[key], value, atol=2e-6, rtol=1e-5), key
