"""The on-policy update (`actor.reuse_update_logprobs`): one optimizer step over the whole batch takes its
own detached log-probs as the old ones, so the trainer skips the no-grad pass. The step must be the same
step: parameters after it equal those of the update fed by a separate old-log-prob pass."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from role_cases import rl_batch

from quartet.cluster.colocate import HostSet, RoleSpec
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config import ActorConfig, Backend, ClusterConfig
from quartet.core.batch import Batch
from quartet.roles.actor import Actor
from quartet.roles.run_values import RunValues


@pytest.fixture(autouse=True)
def _restore_env(one_local_rank: None) -> None:
    """Local hosts set RANK/WORLD_SIZE/MASTER_* in this process; restore them after each test."""


def _actor(cfg: ActorConfig, run: RunValues, tag: str) -> HostSet:
    return launch(
        ClusterConfig(backend=Backend.LOCAL), RunNames("on-policy", tag), actor=RoleSpec(Actor, cfg, run)
    )


def _params(hosts: HostSet) -> dict[str, torch.Tensor]:
    def grab(role: Actor) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in role.engine.module.named_parameters()}

    return dict(hosts.groups["actor"].execute(grab)[0])


def test_update_without_old_logprobs_is_the_same_step(
    actor_config: ActorConfig, run_values: RunValues
) -> None:
    batch = rl_batch(8)
    separate, fused = _actor(actor_config, run_values, "a"), _actor(actor_config, run_values, "b")
    try:
        a, b = separate.groups["actor"], fused.groups["actor"]
        old = a.compute_logprobs(batch)
        (m_sep,) = a.update(batch.union(old.select("old_logprobs")))
        rollout = batch.union(Batch({"rollout_logprobs": old["old_logprobs"] + 0.01}))
        (m_fused,) = b.update(rollout)
        before_update = old["old_logprobs"]
        after_a, after_b = _params(separate), _params(fused)
        for name, value in after_a.items():
            assert torch.allclose(value, after_b[name], atol=1e-6), name
        assert m_fused["actor/pg_loss"] == pytest.approx(m_sep["actor/pg_loss"], abs=1e-6)
        assert m_fused["actor/grad_norm"] == pytest.approx(m_sep["actor/grad_norm"], rel=1e-5)
        assert m_fused["actor/ppo_kl"] == 0.0 and m_fused["actor/pg_clipfrac"] == 0.0
        # the metrics the skipped pass gave: the entropy of the sampled policy, the engine-vs-trainer gap
        mask = batch["response_mask"] > 0
        assert m_fused["actor/entropy"] > 0
        assert m_fused["rollout/logprob_diff_mean"] == pytest.approx(0.01, abs=1e-4)
        assert not torch.allclose(a.compute_logprobs(batch)["old_logprobs"][mask], before_update[mask])
    finally:
        separate.shutdown()
        fused.shutdown()


def test_several_optimizer_steps_without_old_logprobs_are_refused(
    actor_config: ActorConfig, run_values: RunValues
) -> None:
    hosts = _actor(dataclasses.replace(actor_config, epochs=2), run_values, "c")
    try:
        with pytest.raises(Exception, match="only a single optimizer step"):
            hosts.groups["actor"].update(rl_batch(8))
    finally:
        hosts.shutdown()
