"""RL steps end to end with tiny models: PPO with a critic and GRPO on a real local Ray, every estimator
on the local backend.

What a step must do, checked from the outside: every phase ran (its `timing_s/<phase>` is there), metrics
are finite and carry verl's names, the actor's and critic's parameters moved, the reference's did not.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.cluster.naming import RunNames
from quartet.config import QuartetConfig, load_config, plan_step
from quartet.core.choices import AdvantageEstimator
from quartet.models.loading import load_tokenizer
from quartet.rewards.compute import RewardComputer
from quartet.trainer.feed.batch_source import RolloutScorer, SyncGeneration
from quartet.trainer.feed.rl_data import prepare_rl_data, prompt_batch
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.loop.step import StepRunner, kl_controller
from quartet.trainer.workers.start import Workers, start_workers
from quartet.trainer.workers.weight_sync import open_weight_sync

BASE = [
    "data.train_batch_size=4",
    "data.builtin_train_size=64",
    "data.builtin_val_size=8",
    "data.max_response_length=8",
    "rollout.n=4",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=4",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-3",
    "critic.mini_batch_size=2",
    "critic.micro_batch_size_per_device=4",
    "critic.mixed_precision=float32",
    "critic.optim.lr=1e-3",
]

PPO = [
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=true",
    "rollout.n=1",
    "actor.micro_batch_size_per_device=2",
    "critic.micro_batch_size_per_device=2",
]
GRPO = ["algorithm.adv_estimator=grpo", "actor.use_kl_loss=true"]
COMMON_KEYS = [
    "critic/score/mean",
    "critic/rewards/mean",
    "critic/advantages/mean",
    "critic/returns/mean",
    "response_length/mean",
    "response_length/clip_ratio",
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/grad_norm",
    "rollout/logprob_diff_mean",
    "perf/throughput",
    "timing_s/step",
]
PHASES = ["gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"]


def _config(tiny_model_dir: Path, tmp_path: Path, *overrides: str) -> QuartetConfig:
    paths = [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
    return load_config(None, [*BASE, *paths, *overrides])


def _weights(group: Any) -> dict[str, torch.Tensor]:
    """Rank 0's full parameters of a role's engine (cloned)."""

    def grab(role: Any) -> dict[str, torch.Tensor]:
        module = role.engine.module
        return {
            n: p.detach().full_tensor().clone() if hasattr(p, "full_tensor") else p.detach().clone()
            for n, p in module.named_parameters()
        }

    return group.execute(grab)[0]


def _groups(workers: Workers) -> dict[str, Any]:
    roles = ("actor", "rollout", "reference", "critic", "reward_model")
    return {r: getattr(workers, r) for r in roles if getattr(workers, r) is not None}


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before)


def _run_steps(
    cfg: QuartetConfig, steps: int, tmp_path: Path
) -> tuple[Workers, list[dict[str, float]], dict[str, Any]]:
    tokenizer = load_tokenizer(cfg.model.path)
    data = prepare_rl_data(cfg, tokenizer, tmp_path)
    reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
    workers = start_workers(
        cfg, plan_step(cfg), cfg.model.path, RunNames.new(cfg.cluster.namespace, "steps"), steps
    )
    before = {"actor": _weights(workers.actor)}
    if workers.critic is not None:
        before["critic"] = _weights(workers.critic)
    if workers.reference is not None:
        before["reference"] = _weights(workers.reference)
    metrics = []

    def draw(step: int, k: int) -> Any:
        return prompt_batch(data.train, list(range((step - 1) * 4, step * 4)), step, draw=k)

    try:
        runner = StepRunner(cfg, workers, open_weight_sync(cfg, workers), kl_controller(cfg))
        source = SyncGeneration(cfg, workers, RolloutScorer(cfg, workers.reward_model, reward), draw)
        for step in range(1, steps + 1):
            metrics.append(runner.run(source, step).metrics)
    except BaseException:
        workers.shutdown()
        raise
    finally:
        reward.close()
    return workers, metrics, before


def _check_metrics(metrics: list[dict[str, float]], keys: list[str], phases: list[str]) -> None:
    for m in metrics:
        missing = [k for k in keys + [f"timing_s/{p}" for p in phases] if k not in m]
        assert not missing, f"missing metrics {missing}"
        bad = {k: v for k, v in m.items() if not math.isfinite(v)}
        assert not bad, f"non-finite metrics {bad}"


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_three_steps_on_ray(ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, algo: str) -> None:
    # PPO puts its critic on a pool of its own (cluster.separate_pools); GRPO keeps every role on one
    separate = ["cluster.separate_pools=[critic]", "cluster.cpus_per_bundle=0.5"] if algo == "ppo" else []
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        *(PPO if algo == "ppo" else GRPO),
        "cluster.namespace=quartet-tests",
        *separate,
    )
    workers, metrics, before = _run_steps(cfg, 3, tmp_path)
    try:
        pids = {role: group.execute(lambda _: os.getpid())[0] for role, group in _groups(workers).items()}
        if algo == "ppo":
            assert pids["critic"] != pids["actor"] == pids["reference"] == pids["rollout"]
        else:
            assert len(set(pids.values())) == 1  # one host process holds every role
        assert _changed(before["actor"], _weights(workers.actor))
        assert not _changed(before["reference"], _weights(workers.reference))
        if algo == "ppo":
            assert workers.critic is not None and _changed(before["critic"], _weights(workers.critic))
            _check_metrics(
                metrics,
                [*COMMON_KEYS, "critic/vf_loss", "critic/values/mean", "actor/reward_kl_penalty"],
                [*PHASES, "values", "update_critic"],
            )
        else:
            assert workers.critic is None
            _check_metrics(metrics, [*COMMON_KEYS, "actor/kl_loss"], PHASES)
        # after each weight sync the engine samples from the trainer's policy
        assert all(m["rollout/logprob_diff_mean"] < 1e-4 for m in metrics)
    finally:
        workers.shutdown()


@pytest.mark.parametrize("estimator", list(AdvantageEstimator))
@pytest.mark.usefixtures("one_local_rank")
def test_every_estimator_runs_a_step(
    tiny_model_dir: Path, tmp_path: Path, estimator: AdvantageEstimator, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tiny_model_dir, tmp_path, f"algorithm.adv_estimator={estimator}", "cluster.backend=local")
    workers, metrics, before = _run_steps(cfg, 1, tmp_path)
    try:
        phases = ["gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights"]
        if estimator.needs_critic:
            phases += ["values", "update_critic"]
        _check_metrics(metrics, [k for k in COMMON_KEYS], phases)
        assert _changed(before["actor"], _weights(workers.actor))
    finally:
        workers.shutdown()


@pytest.mark.usefixtures("one_local_rank")
def test_full_run_writes_records_and_validates(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(
        tiny_model_dir, tmp_path, "cluster.backend=local", "trainer.total_steps=2", "trainer.test_freq=1"
    )
    records: list[dict[str, Any]] = []
    result = RLTrainer(cfg, on_record=records.append).run()
    assert result.steps == 2
    assert [r["step"] for r in records if r["kind"] == "val"] == [0, 1, 2]
    val_key = "val-core/arithmetic/reward/mean@1"
    assert all(0.0 <= r[val_key] <= 1.0 for r in records if r["kind"] == "val")
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(records)  # every record is on disk too
    assert (result.run_dir / "config.yaml").exists()
    (startup,) = [r for r in records if r["kind"] == "startup"]  # once, right after the first step
    assert records.index(startup) == records.index(next(r for r in records if r["kind"] == "step")) + 1
    laps = ["imports_s", "prepare_s", "trackers_s", "reward_pool_s", "workers_s", "first_step_s"]
    assert all(startup[k] >= 0 for k in laps) and startup["workers/roles_s"] <= startup["workers_s"] + 1e-3
    assert startup["first_step_s"] == pytest.approx(
        records[records.index(startup) - 1]["timing_s/step"], abs=1e-3
    )
    assert sum(startup[k] for k in laps) <= startup["to_first_step_end_s"] + 1e-3  # the laps do not overlap
    assert startup["to_first_step_s"] == pytest.approx(
        startup["to_first_step_end_s"] - startup["first_step_s"]
    )


@pytest.mark.usefixtures("one_local_rank")
def test_dynamic_sampling_draws_more_prompts_in_a_real_step(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        "cluster.backend=local",
        "algorithm.filter_groups=true",
        "algorithm.max_num_gen_batches=3",
    )
    tokenizer = load_tokenizer(cfg.model.path)
    data = prepare_rl_data(cfg, tokenizer, tmp_path)
    reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
    workers = start_workers(
        cfg, plan_step(cfg), cfg.model.path, RunNames.new(cfg.cluster.namespace, "dapo"), 1
    )
    drawn: list[int] = []

    def draw(step: int, k: int) -> Any:  # k > 0: dynamic sampling's extra draws
        if k == 0:
            return prompt_batch(data.train, [0, 1, 2, 3], 1)
        drawn.append(k)
        return prompt_batch(data.train, list(range(4 * k, 4 * k + 4)), 1, draw=k)

    try:
        runner = StepRunner(cfg, workers, open_weight_sync(cfg, workers), kl_controller(cfg))
        scorer = RolloutScorer(cfg, workers.reward_model, reward)
        source = SyncGeneration(cfg, workers, scorer, draw, pad_id=data.train.pad_id)
        trained = runner.run(source, 1)
        batch, metrics = trained.batch, trained.metrics
    finally:
        workers.shutdown()
        reward.close()
    kept, padded = metrics["dynamic_sampling/kept_groups"], metrics["dynamic_sampling/padded_groups"]
    assert len(batch) == 4 * cfg.rollout.n  # always the configured batch
    assert metrics["dynamic_sampling/gen_batches"] == 1 + len(drawn)
    assert drawn == list(range(1, len(drawn) + 1)) and len(drawn) <= 2
    assert padded == max(0.0, 4 - kept)
    # the informative groups lead the batch: each of the first min(kept, 4) groups has unequal scores
    scores = batch["token_level_scores"].sum(-1).view(4, cfg.rollout.n)
    informative = (scores.max(-1).values > scores.min(-1).values).tolist()
    assert informative == [True] * int(min(kept, 4)) + [False] * int(padded)


def test_kl_controller_takes_the_floor_from_the_config() -> None:
    # the trainer's controller carries algorithm.kl_ctrl.min_coef (docs/from_verl.md, the adaptive floor)
    kl_ctrl = {"kind": "adaptive", "coef": "0.01", "min_coef": "0.002"}
    cfg = load_config(overrides=[f"algorithm.kl_ctrl.{key}={value}" for key, value in kl_ctrl.items()])
    ctrl = kl_controller(cfg)
    ctrl.update(0.0, n_steps=10**6)  # the factor is far below 0: verl's coefficient would change sign
    assert ctrl.value == 0.002
