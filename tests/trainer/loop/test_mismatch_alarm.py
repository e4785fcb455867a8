"""The log-prob mismatch alarm (`trainer.mismatch_alarm`): injected mismatches trip it, a correct run not.

Step level, local backend, tiny model (no Ray): a stale engine (the weight push after the update skipped),
an engine in bfloat16 next to a float32 trainer, and the control run with neither. The per-sample figures
of the message are checked against a recomputation from the batch's own columns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from quartet.cluster.naming import RunNames
from quartet.config import ConfigError, Dtype, QuartetConfig, WeightApply, load_config, plan_step
from quartet.core.batch import Batch
from quartet.models.loading import load_tokenizer
from quartet.rewards.compute import RewardComputer
from quartet.trainer.feed.batch_source import RolloutScorer, SyncGeneration
from quartet.trainer.feed.rl_data import prepare_rl_data, prompt_batch
from quartet.trainer.loop.mismatch_alarm import (
    FP32_MAX_ABS_DIFF,
    LOW_PRECISION_MAX_ABS_DIFF,
    MismatchAlarm,
    MismatchAlarmError,
    MismatchWatch,
)
from quartet.trainer.loop.no_signal_alarm import NoSignalAlarm
from quartet.trainer.loop.step import StepRunner, kl_controller
from quartet.trainer.workers.start import start_workers
from quartet.trainer.workers.weight_sync import WeightSync, open_weight_sync

BASE = [
    "cluster.backend=local",
    "data.train_batch_size=4",
    "data.builtin_train_size=32",
    "data.max_response_length=16",
    "rollout.n=4",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=4",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-4",
    # GAE: the critic's values make the advantages nonzero, so the update moves the tiny policy
    "algorithm.adv_estimator=gae",
    "critic.mini_batch_size=2",
    "critic.micro_batch_size_per_device=4",
    "critic.mixed_precision=float32",
]


class SkippedPush(WeightSync):
    """A weight sync that reports success and sends nothing: the engine keeps sampling the old weights."""

    def sync(self, version: int, apply: WeightApply | None = None) -> dict[str, float]:
        return {}


def _config(model: Path, out: Path, *overrides: str) -> QuartetConfig:
    return load_config(None, [*BASE, f"model.path={model}", f"trainer.output_dir={out}", *overrides])


def _run(cfg: QuartetConfig, steps: int, out: Path, skip_push: bool = False) -> tuple[list[Any], list[Any]]:
    """`steps` steps; (each step's metrics, the alarms `on_alarm` was given). Raises what the step raises."""
    tokenizer = load_tokenizer(cfg.model.path)
    data = prepare_rl_data(cfg, tokenizer, out)
    reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
    workers = start_workers(cfg, plan_step(cfg), cfg.model.path, RunNames.new("t", "alarm"), steps)
    metrics: list[dict[str, float]] = []
    alarms: list[MismatchAlarm | NoSignalAlarm] = []  # 2 steps: under trainer.no_signal_steps

    def draw(step: int, k: int) -> Batch:
        return prompt_batch(data.train, list(range((step - 1) * 4, step * 4)), step, draw=k)

    try:
        weights = SkippedPush() if skip_push else open_weight_sync(cfg, workers)
        runner = StepRunner(cfg, workers, weights, kl_controller(cfg), on_alarm=alarms.append)
        source = SyncGeneration(cfg, workers, RolloutScorer(cfg, workers.reward_model, reward), draw)
        for step in range(1, steps + 1):
            metrics.append(runner.run(source, step).metrics)
    finally:
        workers.shutdown()
        reward.close()
    return metrics, alarms


@pytest.mark.usefixtures("one_local_rank")
def test_control_run_does_not_trip(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics, alarms = _run(_config(tiny_model_dir, tmp_path), 2, tmp_path)
    assert alarms == []
    assert [m["alarm/mismatch"] for m in metrics] == [0.0, 0.0]
    assert all(m["rollout/logprob_diff_mean"] <= FP32_MAX_ABS_DIFF for m in metrics)


@pytest.mark.usefixtures("one_local_rank")
def test_stale_engine_trips_at_the_step_after_the_skipped_push(tiny_model_dir: Path, tmp_path: Path) -> None:
    metrics, alarms = _run(_config(tiny_model_dir, tmp_path), 2, tmp_path, skip_push=True)
    assert [m["alarm/mismatch"] for m in metrics] == [0.0, 1.0]  # step 1 sampled the trainer's weights
    (alarm,) = alarms
    (finding,) = alarm.findings
    assert alarm.step == 2 and finding.phase == "recompute"
    assert finding.value == pytest.approx(metrics[1]["rollout/logprob_diff_mean"], rel=1e-4)
    assert finding.value > 10 * FP32_MAX_ABS_DIFF
    # the skipped push left the engine's version behind too: the first cause says so, the stale sync next
    assert finding.causes[0] == "the engine reports weight versions [0] for these tokens, the trainer is at 1"
    assert finding.causes[1].startswith("stale or failed weight sync")
    message = alarm.message()
    assert "step 2" in message and "recompute" in message
    for worst in finding.worst:
        assert f"uid {worst.uid}" in message
    means = [w.mean for w in finding.worst]
    assert means == sorted(means, reverse=True) and means[0] >= finding.value


@pytest.mark.usefixtures("one_local_rank")
def test_bf16_engine_next_to_fp32_trainer_stops_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _config(tiny_model_dir, tmp_path, "rollout.dtype=bfloat16", "trainer.mismatch_alarm=stop")
    with pytest.raises(MismatchAlarmError) as caught:
        _run(cfg, 1, tmp_path)
    text = str(caught.value)
    assert "step 1" in text and "recompute" in text
    assert "dtype differs between engine and trainer: rollout.dtype=bfloat16" in text
    assert "trainer.mismatch_alarm=stop" in text


# ---- the checks on hand-made batches ---------------------------------------------------------------------


def _batch(rollout: torch.Tensor, trainer: torch.Tensor, mask: torch.Tensor, **non_tensors: Any) -> Batch:
    columns = {"rollout_logprobs": rollout, "old_logprobs": trainer, "response_mask": mask}
    uids = np.array([f"u{i}" for i in range(len(mask))], dtype=object)
    return Batch(columns, {"uid": uids, **non_tensors})


def _watch(tmp_path: Path, *overrides: str) -> MismatchWatch:
    return MismatchWatch.from_config(load_config(None, [f"trainer.output_dir={tmp_path}", *overrides]))


def test_per_sample_figures_and_masked_tokens(tmp_path: Path) -> None:
    watch = _watch(tmp_path, "actor.mixed_precision=float32")
    trainer = torch.zeros(3, 4)
    rollout = torch.tensor([[0.1, 0.3, 9.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]])  # the 9.0 is padding: never counted
    watch.check_logprobs(_batch(rollout, trainer, mask), version=0)
    alarm = watch.take(5)
    assert alarm is not None and watch.take(6) is None  # taken once
    (finding,) = alarm.findings
    assert finding.value == pytest.approx((0.1 + 0.3 + 4 * 0.25) / 10)  # token-weighted mean
    got = [(w.row, w.uid, w.mean, w.max) for w in finding.worst]
    assert got == [  # by per-sample mean, over each sample's own tokens
        (2, "u2", pytest.approx(0.25), pytest.approx(0.25)),
        (0, "u0", pytest.approx(0.2), pytest.approx(0.3)),
        (1, "u1", 0.0, 0.0),
    ]
    assert "step 5" in alarm.message() and "row 0 uid u0: mean 0.2, max 0.3" in alarm.message()


def test_threshold_follows_the_trainer_dtype(tmp_path: Path) -> None:
    assert _watch(tmp_path, "actor.mixed_precision=float32").max_abs_diff == FP32_MAX_ABS_DIFF
    bf16 = _watch(tmp_path, "actor.mixed_precision=bfloat16")
    assert bf16.max_abs_diff == LOW_PRECISION_MAX_ABS_DIFF and bf16.trainer_dtype is Dtype.BFLOAT16
    assert _watch(tmp_path, "trainer.mismatch_alarm_max_abs_diff=0.2").max_abs_diff == 0.2
    with pytest.raises(ConfigError, match="mismatch_alarm_max_abs_diff"):
        _watch(tmp_path, "trainer.mismatch_alarm_max_abs_diff=-1")


SEPARATE = ("cluster.separate_pools=[rollout]",)


def test_ahead_of_training_only_rows_of_the_current_version_count(tmp_path: Path) -> None:
    lagging = torch.tensor([[0.5, 0.5], [0.0, 0.0], [0.0, 0.5]])
    mask = torch.ones(3, 2, dtype=torch.int64)
    versions = torch.tensor([[2, 2], [3, 3], [2, 3]])  # row 2: the weights changed mid-generation
    batch = _batch(lagging, torch.zeros(3, 2), mask).union(Batch({"rollout_versions": versions}))
    ahead = _watch(tmp_path, "actor.mixed_precision=float32", "trainer.mode=async", *SEPARATE)
    ahead.check_logprobs(batch, version=3)  # rows 0 and 2 lag: by design, not a mismatch
    assert ahead.take(1) is None
    sync = _watch(tmp_path, "actor.mixed_precision=float32")
    sync.check_logprobs(batch, version=3)  # in sync mode every token must be the trainer's
    alarm = sync.take(1)
    assert alarm is not None and alarm.findings[0].value == pytest.approx(1.5 / 6)
    lag = "the engine reports weight versions [2, 3] for these tokens, the trainer is at 3"
    assert alarm.findings[0].causes[0] == lag


def test_drift_finding_and_off(tmp_path: Path) -> None:
    drift = [
        {"agent/token_drift": 0.0, "agent/assistant_turns": 2.0},
        {"agent/token_drift": 7.0, "agent/assistant_turns": 2.0},
        {"agent/token_drift": 1.0, "agent/assistant_turns": 1.0},
    ]
    batch = _batch(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 2), agent_metrics=np.array(drift))
    watch = _watch(tmp_path)
    watch.check_drift(batch)
    watch.check_logprobs(batch, version=0)  # no log-prob difference: only the drift trips
    alarm = watch.take(4)
    assert alarm is not None and alarm.phases == "drift"
    (finding,) = alarm.findings
    assert finding.value == pytest.approx(2 / 3) and finding.threshold == 0.5  # 2 of 3 trajectories drift
    assert [w.row for w in finding.worst] == [1, 2, 0] and finding.worst[0].mean == 7.0
    assert finding.causes[0].startswith("chat template re-rendering")  # one of the two is multi-turn
    assert alarm.record()["phase"] == "drift"
    single = [{**d, "agent/assistant_turns": 1.0} for d in drift]  # nothing earlier to re-render
    watch.check_drift(
        _batch(torch.zeros(3, 2), torch.zeros(3, 2), torch.ones(3, 2), agent_metrics=np.array(single))
    )
    later = watch.take(5)
    assert later is not None and later.findings[0].causes[0].startswith("non-canonical tokenization")
    lenient = _watch(tmp_path, "trainer.mismatch_alarm_max_drift_share=0.7")
    lenient.check_drift(batch)
    assert lenient.take(4) is None
    off = _watch(tmp_path, "trainer.mismatch_alarm=off")
    off.check_drift(batch)
    assert off.take(4) is None


def test_the_alarm_record_and_its_console_line(tmp_path: Path) -> None:
    from quartet.tracking.console_sink import format_record

    watch = _watch(tmp_path, "actor.mixed_precision=float32")
    watch.check_update_mean(0.01)  # the on-policy update's mean: no per-sample figures
    alarm = watch.take(7)
    assert alarm is not None
    record = alarm.record()
    figures = (
        record["step"],
        record["phase"],
        record["alarm/mismatch_value"],
        record["alarm/mismatch_threshold"],
    )
    assert figures == (7, "update", 0.01, 3e-4)
    assert record["message"] == alarm.message() and "no per-sample figures" in record["message"]
    line = format_record({"kind": "alarm", **record})
    assert line == "alarm  step 7  mismatch (update)  0.01 > 0.0003"


@pytest.mark.slow  # a whole run with a checkpoint (~6 s alone): the one check that stop reaches failure_save
@pytest.mark.usefixtures("one_local_rank")
def test_stop_ends_the_run_through_the_failure_save(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole run: the weight push after step 1 skipped, `stop` ends step 2 before its update; the
    failure path checkpoints step 1 and marks the run failed; metrics.jsonl holds the alarm record."""
    from quartet.cluster.run_record import load_run_state
    from quartet.trainer.loop.rl_trainer import RLTrainer
    from quartet.trainer.recovery.checkpoint import list_checkpoints
    from quartet.trainer.workers.weight_sync import InProcessSync

    monkeypatch.setattr(InProcessSync, "sync", SkippedPush.sync)
    steps = ["trainer.total_steps=3", "trainer.test_freq=0", "trainer.val_before_train=false"]
    cfg = _config(tiny_model_dir, tmp_path, "trainer.mismatch_alarm=stop", *steps)
    with pytest.raises(MismatchAlarmError, match="alarm at step 2 .phase recompute.") as caught:
        RLTrainer(cfg).run()
    assert "stale or failed weight sync" in str(caught.value)
    run_dir = cfg.trainer.run_dir
    assert [p.name for p in list_checkpoints(run_dir)] == ["global_step_1"]
    state = load_run_state(run_dir)
    assert state is not None and state.state == "failed" and "MismatchAlarmError" in state.error
    written = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in written if r["kind"] in ("step", "alarm")] == [
        ("step", 1),
        ("alarm", 2),
    ]


def test_a_log_prob_finding_names_drift_and_the_differing_dtype(tmp_path: Path) -> None:
    drift = np.array([{"agent/token_drift": 0.0}, {"agent/token_drift": 3.0}])
    batch = _batch(torch.ones(2, 2), torch.zeros(2, 2), torch.ones(2, 2), agent_metrics=drift)
    watch = _watch(tmp_path, "actor.mixed_precision=float32", "rollout.dtype=bfloat16")
    watch.check_logprobs(batch, version=0)
    alarm = watch.take(3)
    assert alarm is not None
    causes = alarm.findings[0].causes
    assert causes[0].startswith("dtype differs between engine and trainer: rollout.dtype=bfloat16")
    assert causes[-1] == "chat template re-rendering: 50% of the trajectories drift this step"
