"""The rollout role next to the actor: generation, weight sync in-process (plain, LoRA, FSDP2), sleep/wake.

The check is the one the trainer logs (`rollout/logprob_diff_*`): log-probs the engine reported while
sampling vs the trainer's recomputation of the same tokens. Equal weights give ~0; an update without a sync
gives a visible difference; the sync brings it back to ~0.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.host import Sibling
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.cluster.runtime import launch
from quartet.config import ActorConfig, Backend, ClusterConfig, Dtype, LoraConfig, OptimConfig, RolloutConfig
from quartet.core.batch import Batch, BatchMeta
from quartet.core.metrics import logprob_diff_metrics
from quartet.models.loading import load_tokenizer
from quartet.roles.actor import Actor
from quartet.roles.rollout import Rollout
from quartet.roles.run_values import RunValues

QUESTIONS = ["What is 3+4?", "What is 12-5?"]


ACTOR = ActorConfig(
    optim=OptimConfig(lr=0.05, grad_clip=1e6),
    mini_batch_size=2,
    micro_batch_size_per_device=4,
    shuffle=False,
    mixed_precision=Dtype.FLOAT32,
)


@dataclasses.dataclass(frozen=True)
class Sections:
    """What the actor and rollout roles are built from: their own sections and the run-wide values."""

    actor: ActorConfig
    rollout: RolloutConfig
    run: RunValues
    lora: LoraConfig = LoraConfig()


@pytest.fixture
def sections(tiny_model_dir: Path) -> Sections:
    """2 prompts x 4 responses of at most 8 tokens; one optimizer step per update."""
    run = RunValues(
        str(tiny_model_dir),
        max_prompt_length=64,
        max_response_length=8,
        prompts_per_step=2,
        responses_per_prompt=4,
        trainer_steps=10,
    )
    return Sections(ACTOR, RolloutConfig(n=4), run)


def prompt_batch(model_dir: Path, step: int = 0) -> Batch:
    tok = load_tokenizer(model_dir)
    ids = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, return_dict=False
        )
        for q in QUESTIONS
    ]
    width = max(map(len, ids))
    prompts = torch.full((len(ids), width), tok.pad_token_id, dtype=torch.int64)
    mask = torch.zeros(len(ids), width, dtype=torch.int64)
    for i, row in enumerate(ids):
        prompts[i, width - len(row) :] = torch.tensor(row)
        mask[i, width - len(row) :] = 1
    return Batch(
        {"prompts": prompts, "attention_mask": mask}, {"uid": QUESTIONS}, meta=BatchMeta(global_step=step)
    )


def _diff(actor: Any, generated: Batch) -> dict[str, float]:
    trainer = actor.compute_logprobs(generated)
    return logprob_diff_metrics(
        generated["rollout_logprobs"], trainer["old_logprobs"], generated["response_mask"]
    )


def _update(actor: Any, generated: Batch) -> None:
    g = torch.Generator().manual_seed(0)
    advantages = torch.randn(generated["responses"].shape, generator=g) * generated["response_mask"]
    old = actor.compute_logprobs(generated).select("old_logprobs")
    actor.update(generated.union(old).union(Batch({"advantages": advantages})))


def _round_trip(actor: Any, rollout: Any, model_dir: Path) -> tuple[float, float, float]:
    """(diff before any update, diff after an update without sync, diff after sync): mean abs log-prob."""
    first = rollout.generate(prompt_batch(model_dir, 0))
    before = _diff(actor, first)["rollout/logprob_diff_mean"]
    _update(actor, first)
    stale = _diff(actor, rollout.generate(prompt_batch(model_dir, 1)))["rollout/logprob_diff_mean"]
    rollout.sync_weights()
    synced = _diff(actor, rollout.generate(prompt_batch(model_dir, 2)))
    assert synced["rollout/logprob_diff_max"] < 1e-4
    return before, stale, synced["rollout/logprob_diff_mean"]


def _specs(s: Sections) -> dict[str, RoleSpec]:
    return {
        "actor": RoleSpec(Actor, s.actor, s.run, lora=s.lora),
        "rollout": RoleSpec(Rollout, s.rollout, s.run, trainer=Sibling("actor")),
    }


def _local(s: Sections) -> Any:
    return launch(ClusterConfig(backend=Backend.LOCAL), RunNames("t", "rollout"), **_specs(s))


@pytest.fixture
def single_rank_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "0" if key != "WORLD_SIZE" else "1")


def test_generate_layout_and_sync_after_update(
    sections: Sections, tiny_model_dir: Path, single_rank_env: None
) -> None:
    hosts = _local(sections)
    try:
        actor, rollout = hosts.groups["actor"], hosts.groups["rollout"]
        out = rollout.generate(prompt_batch(tiny_model_dir))
        assert len(out) == len(QUESTIONS) * 4
        assert (
            out["responses"].shape[1] <= 8
            and out["attention_mask"].shape[1] == out["prompts"].shape[1] + out["responses"].shape[1]
        )
        assert list(out.non_tensors["uid"]) == [q for q in QUESTIONS for _ in range(4)]
        before, stale, synced = _round_trip(actor, rollout, tiny_model_dir)
        assert before < 1e-5 and synced < 1e-5
        assert stale > 100 * max(synced, 1e-7)  # the update moved the policy; the sync caught up
    finally:
        hosts.shutdown()


def test_sleep_frees_the_cache_and_generate_wakes(
    sections: Sections, tiny_model_dir: Path, single_rank_env: None
) -> None:
    hosts = _local(sections)
    try:
        rollout = hosts.groups["rollout"]
        rollout.generate(prompt_batch(tiny_model_dir))
        assert rollout.execute(lambda r: r.engine.kv_cache_bytes)[0] > 0
        rollout.sleep()
        assert rollout.execute(lambda r: (r.asleep, r.engine.kv_cache_bytes)) == [(True, 0)]
        assert len(rollout.generate(prompt_batch(tiny_model_dir))) == len(QUESTIONS) * 4
        assert rollout.execute(lambda r: r.asleep) == [False]
    finally:
        hosts.shutdown()


def test_lora_actor_syncs_merged_weights(
    sections: Sections, tiny_model_dir: Path, single_rank_env: None
) -> None:
    pytest.importorskip("peft")
    hosts = _local(dataclasses.replace(sections, lora=LoraConfig(rank=4, alpha=8)))
    try:
        before, stale, synced = _round_trip(hosts.groups["actor"], hosts.groups["rollout"], tiny_model_dir)
        assert before < 1e-5 and synced < 1e-5 and stale > 100 * max(synced, 1e-7)
    finally:
        hosts.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_fsdp2_two_ranks_gather_into_each_engine(
    ray_cluster: None, sections: Sections, tiny_model_dir: Path
) -> None:
    pool = ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=60).create()
    hosts = colocate(
        pool,
        RunNames("quartet-tests", "rollout-fsdp"),
        **_specs(sections),
    )
    try:
        before, stale, synced = _round_trip(hosts.groups["actor"], hosts.groups["rollout"], tiny_model_dir)
        assert before < 1e-5 and synced < 1e-5 and stale > 100 * max(synced, 1e-7)
    finally:
        hosts.shutdown()
