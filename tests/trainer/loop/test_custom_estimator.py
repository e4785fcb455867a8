"""A custom estimator from a user module (examples/custom_algorithm/my_algo.py) trains 2 steps, and the
advantages the step used are the ones that estimator defines, recomputed here the slow way.

The user module of the run is a temp file that imports the example and registers a reward for the rows'
data source (`@register_reward`), scored in the reward pool's worker processes: it gives varied scores
within each group (an untrained tiny model scores 0 on arithmetic, which would make every advantage 0)."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import pytest
import torch
from test_rl_steps import BASE, _changed, _weights

from quartet.cluster.naming import RunNames
from quartet.config import load_config, plan_step
from quartet.core.registry import CUSTOM_MODULES_ENV, registered_estimators
from quartet.models.loading import load_tokenizer
from quartet.rewards.compute import RewardComputer
from quartet.trainer.feed.batch_source import RolloutScorer, SyncGeneration
from quartet.trainer.feed.rl_data import prepare_rl_data, prompt_batch
from quartet.trainer.loop.step import StepRunner, kl_controller
from quartet.trainer.workers.start import start_workers
from quartet.trainer.workers.weight_sync import open_weight_sync

MODULE = Path(__file__).parents[3] / "examples" / "custom_algorithm" / "my_algo.py"


USER_MODULE = """
from quartet.core.registry import import_custom_module
from quartet.rewards.registry import register_reward

import_custom_module({example!r})


@register_reward("arithmetic")
def length_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 5) + 0.25 * solution_str.count("1")
"""


def _median_baseline_by_hand(
    scores: list[float], uids: list[object], mask: list[list[bool]]
) -> list[list[float]]:
    """A[i, t] = R_i - lower median of R over i's prompt group, on valid tokens (the example's docstring)."""
    out = []
    for i, row in enumerate(mask):
        group = [scores[j] for j in range(len(scores)) if uids[j] == uids[i]]
        a = scores[i] - statistics.median_low(group)
        out.append([a if m else 0.0 for m in row])
    return out


@pytest.fixture(autouse=True)
def _inherited_modules_stay_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importing a custom module lists it in `QUARTET_CUSTOM_MODULES` for the processes this one starts; the
    variable is restored after each test, so later tests' reward workers do not import these modules (one
    registers a reward for `arithmetic`)."""
    monkeypatch.setenv(CUSTOM_MODULES_ENV, "")


@pytest.mark.usefixtures("one_local_rank")
def test_custom_estimator_trains_two_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    user = tmp_path / "user_algo.py"
    user.write_text(USER_MODULE.format(example=str(MODULE)))
    overrides = [
        *BASE,
        f"model.path={tiny_model_dir}",
        f"trainer.output_dir={tmp_path}",
        "cluster.backend=local",
        f"algorithm.custom_module={user}",
        "algorithm.adv_estimator=median_baseline",
    ]
    cfg = load_config(None, overrides)
    assert "median_baseline" in registered_estimators() and cfg.algorithm.needs_group
    tokenizer = load_tokenizer(cfg.model.path)
    data = prepare_rl_data(cfg, tokenizer, tmp_path)
    reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
    workers = start_workers(
        cfg, plan_step(cfg), cfg.model.path, RunNames.new(cfg.cluster.namespace, "custom"), 2
    )
    try:
        before = _weights(workers.actor)
        runner = StepRunner(cfg, workers, open_weight_sync(cfg, workers), kl_controller(cfg))
        scorer = RolloutScorer(cfg, workers.reward_model, reward)
        source = SyncGeneration(
            cfg,
            workers,
            scorer,
            lambda step, k: prompt_batch(data.train, list(range((step - 1) * 4, step * 4)), step),
        )
        for step in (1, 2):
            trained = runner.run(source, step)
            batch, metrics = trained.batch, trained.metrics
            mask = (batch["response_mask"] != 0).tolist()
            rewards = batch["token_level_rewards"].double()
            scores = [
                sum(r for r, m in zip(row, mrow, strict=True) if m)
                for row, mrow in zip(rewards.tolist(), mask, strict=True)
            ]
            uids = list(batch.non_tensors["uid"])
            expected = torch.tensor(_median_baseline_by_hand(scores, uids, mask), dtype=torch.float64)
            torch.testing.assert_close(batch["advantages"].double(), expected, rtol=0, atol=1e-6)
            assert expected.abs().max() > 0
            assert len(set(uids)) == 4 and all(uids.count(u) == 4 for u in set(uids))
            assert "actor/pg_loss" in metrics and "timing_s/adv" in metrics
        assert _changed(before, _weights(workers.actor))  # the policy trained on those advantages
    finally:
        workers.shutdown()
        reward.close()
        _forget_reward("arithmetic")  # the registration is process-wide: later tests score arithmetic again


def _forget_reward(data_source: str) -> None:
    from quartet.rewards import registry

    registry._REWARDS.pop(data_source, None)


LOSS_MODULE = """
import os

import torch

from quartet.core.policy_loss import TokenLosses, reinforce_token_losses
from quartet.core.registry import register_policy_loss


@register_policy_loss("marked_reinforce")
def marked_reinforce(logprob, old_logprob, advantages, response_mask, clip):
    base = reinforce_token_losses(logprob, old_logprob, advantages, response_mask, clip)
    # the process that computed the loss, and a constant that only this function reports
    marks = {"custom/loss_pid": torch.tensor(float(os.getpid())), "custom/marker": torch.tensor(42.0)}
    return TokenLosses(base.losses, {**base.metrics, **marks})
"""


@pytest.mark.ray
@pytest.mark.slow
def test_registered_policy_loss_runs_in_the_ray_actor(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # The actor is a Ray actor in another process: the custom module must be imported THERE (the config
    # arrives pickled, and registrations live in the importing process), or the loss lookup fails.
    module = tmp_path / "loss_module.py"
    module.write_text(LOSS_MODULE)
    cfg = load_config(
        None,
        [
            *BASE,
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "cluster.namespace=quartet-tests",
            f"algorithm.custom_module={module}",
            "actor.policy_loss=marked_reinforce",
        ],
    )
    tokenizer = load_tokenizer(cfg.model.path)
    data = prepare_rl_data(cfg, tokenizer, tmp_path)
    reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
    workers = start_workers(
        cfg, plan_step(cfg), cfg.model.path, RunNames.new(cfg.cluster.namespace, "custom-loss"), 1
    )
    try:
        runner = StepRunner(cfg, workers, open_weight_sync(cfg, workers), kl_controller(cfg))
        scorer = RolloutScorer(cfg, workers.reward_model, reward)
        source = SyncGeneration(
            cfg, workers, scorer, lambda step, k: prompt_batch(data.train, [0, 1, 2, 3], 1)
        )
        metrics = runner.run(source, 1).metrics
        actor_pid = workers.actor.execute(lambda _: os.getpid())[0]
        assert actor_pid != os.getpid()
        assert metrics["custom/marker"] == 42.0
        assert metrics["custom/loss_pid"] == float(actor_pid)  # computed in the Ray actor's process
    finally:
        workers.shutdown()
        reward.close()
