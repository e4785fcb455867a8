"""Actor and reference roles on the local backend, and a 2-rank FSDP2 update on a real Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from role_cases import local, rl_batch
from transformers import AutoModelForCausalLM

from quartet.cluster.colocate import RoleSpec
from quartet.config import ActorConfig, Dtype, LoraConfig, ReferenceConfig
from quartet.roles.actor import Actor
from quartet.roles.reference import Reference
from quartet.roles.run_values import RunValues


@pytest.fixture(autouse=True)
def _restore_env(one_local_rank: None) -> None:
    """Local hosts set RANK/WORLD_SIZE/MASTER_* in this process; restore them after each test."""


def _reference_logprobs(
    model: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor, attention: torch.Tensor
) -> torch.Tensor:
    """Per row, without padding: log_softmax(model(ids).logits) gathered at the response tokens."""
    rows, p_len = prompts.shape
    out = torch.zeros(responses.shape)
    for i in range(rows):
        p = prompts[i][attention[i, :p_len] > 0]
        r_valid = attention[i, p_len:] > 0
        r = responses[i][r_valid]
        ids = torch.cat([p, r]).unsqueeze(0)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        logp = torch.log_softmax(logits[len(p) - 1 : len(p) + len(r) - 1], dim=-1)
        out[i, : len(r)] = logp.gather(1, r.unsqueeze(1)).squeeze(1)
    return out


def test_actor_logprobs_and_update_on_the_local_backend(
    actor_config: ActorConfig, run_values: RunValues, tiny_model_dir: Path
) -> None:
    hosts = local(actor=RoleSpec(Actor, actor_config, run_values))
    try:
        actor = hosts.groups["actor"]
        batch = rl_batch(8)
        old = actor.compute_logprobs(batch)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        expected = _reference_logprobs(model, batch["prompts"], batch["responses"], batch["attention_mask"])
        assert torch.allclose(old["old_logprobs"], expected, atol=1e-5)
        assert "entropy" in old and bool((old["entropy"][batch["response_mask"] > 0] > 0).all())
        (metrics,) = actor.update(batch.union(old.select("old_logprobs")))
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr", "actor/pg_clipfrac", "actor/ppo_kl"):
            assert key in metrics, sorted(metrics)
        assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)  # first step: ratio 1
        new = actor.compute_logprobs(batch)["old_logprobs"]
        assert not torch.allclose(new, old["old_logprobs"])  # the policy moved
    finally:
        hosts.shutdown()


def test_lora_actor_serves_the_reference_with_adapters_disabled(
    actor_config: ActorConfig, run_values: RunValues
) -> None:
    hosts = local(
        actor=RoleSpec(Actor, actor_config, run_values, lora=LoraConfig(rank=4, alpha=8)),
        reference=RoleSpec(Reference, ReferenceConfig(), run_values, Dtype.FLOAT32),
    )
    try:
        actor, reference = hosts.groups["actor"], hosts.groups["reference"]
        batch = rl_batch(8, seed=1)
        base = reference.compute_ref_logprobs(batch)["ref_logprobs"]
        assert torch.allclose(actor.compute_ref_logprobs(batch)["ref_logprobs"], base, atol=1e-6)
        old = actor.compute_logprobs(batch)
        actor.update(batch.union(old.select("old_logprobs")))
        assert torch.allclose(actor.compute_ref_logprobs(batch)["ref_logprobs"], base, atol=1e-6)
        assert not torch.allclose(actor.compute_logprobs(batch)["old_logprobs"], base, atol=1e-6)
    finally:
        hosts.shutdown()
