"""Three GRPO updates through the `Actor` role at world 2: one sequence group of two ranks (sp 2) ends with
the same parameters as data parallel only (dp 2) on the same batches (issue 36, part 3).

Each step is what a sync GRPO step asks of the actor: a fresh batch whose advantages come from
`compute_grpo` on per-response rewards (groups of 4 responses), `compute_logprobs` for the old log-probs,
then `update`. Both runs use the packed path (`remove_padding`), so SP is the only difference; rows reach
the ranks through the role's dispatch, as in a run.
"""

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
from quartet.config import ActorConfig
from quartet.core.advantages import compute_grpo
from quartet.core.batch import Batch
from quartet.roles.actor import Actor
from quartet.roles.run_values import RunValues

pytestmark = [pytest.mark.ray, pytest.mark.slow]
STEPS = 3


def grpo_batch(step: int) -> Batch:
    """8 rows (2 prompts x 4 responses) of step `step`, advantages from GRPO on seeded rewards in [0, 1]."""
    batch = rl_batch(8, prompt_len=7, response_len=13, seed=100 + step)
    mask = batch["response_mask"]
    rewards = torch.zeros(mask.shape)
    scores = torch.rand(8, generator=torch.Generator().manual_seed(step))
    rewards[torch.arange(8), mask.sum(1) - 1] = scores
    advantages = compute_grpo(rewards, mask, batch.non_tensors["uid"]).advantages
    return Batch(
        {
            **{k: batch[k] for k in ("prompts", "responses", "attention_mask", "response_mask")},
            "advantages": advantages,
        },
        batch.non_tensors,
        meta=batch.meta,
    )


def _train(actor: Any, folder: Path) -> tuple[dict[str, torch.Tensor], list[float]]:
    norms = []
    for step in range(STEPS):
        batch = grpo_batch(step)
        old = actor.compute_logprobs(batch)
        metrics = actor.update(batch.union(old.select("old_logprobs")))
        norms.append(metrics[0]["actor/grad_norm"])
    actor.export_hf(str(folder))
    return AutoModelForCausalLM.from_pretrained(folder).state_dict(), norms


def test_three_grpo_steps_sp2_equal_dp2(
    ray_cluster: None,
    actor_config: ActorConfig,
    run_values: RunValues,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    # Adam's first step is lr * sign(g); a large eps makes every step proportional to the gradient, so a
    # gradient differing between the layouts would show in the parameters.
    optim = dataclasses.replace(actor_config.optim, eps=1.0, lr=0.1, weight_decay=0.0, grad_clip=1e6)
    actor = dataclasses.replace(actor_config, optim=optim)
    packed = dataclasses.replace(run_values, remove_padding=True)
    results = {}
    for sp in (1, 2):
        spec = RoleSpec(Actor, actor, dataclasses.replace(packed, sequence_parallel_size=sp))
        pool = ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=60).create()
        hosts = colocate(pool, RunNames("quartet-tests", f"grpo3-sp{sp}"), actor=spec)
        try:
            results[sp] = _train(hosts.groups["actor"], tmp_path / f"sp{sp}")
        finally:
            hosts.shutdown()
    (dp, dp_norms), (sp2, sp_norms) = results[1], results[2]
    assert sp_norms == pytest.approx(dp_norms, rel=1e-5)
    assert all(n > 1e-3 for n in dp_norms)  # a gradient at every step
    for key, value in dp.items():
        worst = float((sp2[key] - value).abs().max())
        assert torch.allclose(sp2[key], value, atol=1e-5, rtol=0), (key, worst)
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    moved = [k for k in dp if not torch.equal(dp[k], start[k])]
    assert len(moved) > len(dp) // 2  # three steps really changed the model
