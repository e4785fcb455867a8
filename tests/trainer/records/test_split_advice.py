"""The split advisor (`quartet.trainer.records.split_advice`, `quartet.trainer.records.split_advice_log`):
hand-computed splits and buffers, the config's split, the overrides, and the run-log line after N steps."""

from __future__ import annotations

import logging
import os

import pytest

from quartet.config import ConfigError, load_config
from quartet.trainer.records.split_advice import StepTimes, advise, busy_times, candidates, replay_idle
from quartet.trainer.records.split_advice_log import (
    SplitAdviceLog,
    advice_for,
    advice_overrides,
    plan_advice,
    split_advice_callbacks,
    split_space,
)


def times(gen: list[float], train: list[float], rollout: float, trainer: float) -> StepTimes:
    return StepTimes(tuple(gen), tuple(train), rollout, trainer)


def test_balanced_keeps_the_split_with_no_idle() -> None:
    a = advise(times([2.0] * 4, [2.0] * 4, 1, 1))
    assert (a.best.rollout_share, a.best.trainer_share, a.best.async_buffer) == (1, 1, 1)
    assert a.best.step_s == pytest.approx(2.0)
    assert a.best.trainer_idle_s == pytest.approx(0.0) and a.best.rollout_idle_s == pytest.approx(0.0)
    assert a.bound == "balanced"


def test_generation_bound_moves_devices_to_the_rollout() -> None:
    # work: generation 3 s x 2 = 6 share-s, training 1 s x 2 = 2 share-s; of 4: 3:1 gives 2 s and 2 s
    a = advise(times([3.0] * 4, [1.0] * 4, 2, 2))
    assert (a.best.rollout_share, a.best.trainer_share) == (3, 1)
    assert a.best.step_s == pytest.approx(2.0)
    assert a.current.step_s == pytest.approx(3.0)  # max(3, 1) now
    assert a.current.trainer_idle_s == pytest.approx(2.0)
    steps = {(c.rollout_share, c.trainer_share): c.step_s for c in a.considered}
    assert steps == pytest.approx({(1, 3): 6.0, (2, 2): 3.0, (3, 1): 2.0})
    assert a.bound == "generation-bound"


def test_training_bound_moves_devices_to_the_trainer() -> None:
    a = advise(times([1.0] * 4, [3.0] * 4, 2, 2))
    assert (a.best.rollout_share, a.best.trainer_share) == (1, 3)
    assert a.best.step_s == pytest.approx(2.0)
    assert a.best.rollout_idle_s == pytest.approx(0.0) and a.best.trainer_idle_s == pytest.approx(0.0)
    assert a.bound == "training-bound"


def test_each_pool_keeps_at_least_one_grain() -> None:
    # generation is 100x training: the rollout would take everything, but the trainer keeps 1 of 4
    a = advise(times([10.0] * 3, [0.1] * 3, 2, 2))
    assert (a.best.rollout_share, a.best.trainer_share) == (3, 1)
    assert a.best.step_s == pytest.approx(20.0 / 3)  # 10 s x 2 / 3
    assert a.best.trainer_idle_s == pytest.approx(20.0 / 3 - 0.2)
    assert candidates(2, 1) == [(1, 1)]
    assert candidates(1, 0.25) == [(0.25, 0.75), (0.5, 0.5), (0.75, 0.25)]
    assert candidates(4, 1, minimum=2) == [(2, 2)]


def test_without_a_grain_only_the_current_split() -> None:
    a = advise(times([3.0] * 4, [1.0] * 4, 2, 2), grain=None)
    assert [(c.rollout_share, c.trainer_share) for c in a.considered] == [(2, 2)]
    assert a.best.step_s == pytest.approx(3.0)


def test_alternating_generation_needs_a_deeper_buffer() -> None:
    # training 2 s; generation 1 s and 3 s in turn. One batch ahead: a 3 s batch started at the take
    # arrives 1 s after the trainer is free, every other step -> 0.5 s a step. Two ahead absorb it.
    gen, train = [1.0, 3.0] * 4, [2.0] * 8
    assert replay_idle(gen, train, 1) == pytest.approx(0.5)
    assert replay_idle(gen, train, 2) == pytest.approx(0.0)
    a = advise(times(gen, train, 1, 1))
    assert a.best.async_buffer == 2 and a.best.trainer_idle_s == pytest.approx(0.0)
    assert advise(times(gen, train, 1, 1), buffers=(1,)).best.async_buffer == 1  # one_step_off


def test_steady_generation_faster_than_training_needs_one_batch_ahead() -> None:
    a = advise(times([1.0] * 5, [2.0] * 5, 1, 1), current_buffer=2)
    assert a.best.async_buffer == 1  # a deeper buffer only ages the samples
    assert a.current.async_buffer == 2
    assert replay_idle([1.0], [2.0], 1) == pytest.approx(0.0)
    assert replay_idle([3.0], [2.0], 3) == pytest.approx(1.0)  # generation-bound: no buffer helps


def test_busy_times_from_step_records() -> None:
    records = [
        {"timing_s/step": 2.0, "timing_s/rollout_idle": 0.5, "timing_s/trainer_idle": 0.25},
        {"timing_s/step": 3.0},  # a colocated step: no pool metrics
        {"timing_s/step": 1.0, "timing_s/rollout_idle": 0.0, "timing_s/trainer_idle": 1.0},
    ]
    assert busy_times(records) == ([1.5, 1.0], [1.75, 0.0])


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="share"):
        times([1.0], [1.0], 0, 1)
    with pytest.raises(ValueError, match="one generation and one training"):
        times([1.0, 2.0], [1.0], 1, 1)
    with pytest.raises(ValueError, match="buffer"):
        replay_idle([1.0], [1.0], 0)


ASYNC = ["trainer.mode=async", "cluster.separate_pools=[rollout]", "cluster.device=cpu"]


def test_split_space_of_each_config() -> None:
    assert split_space(load_config(None, ["cluster.device=cpu"])) is None  # colocated: nothing to split
    cpu = split_space(load_config(None, [*ASYNC, "cluster.cpus_per_bundle=2", "cluster.pool_cpus.rollout=1"]))
    assert cpu is not None and (cpu.rollout_share, cpu.trainer_share, cpu.grain) == (1, 2, 1)
    assert cpu.configurable
    gpu = load_config(None, [*ASYNC[:2], "cluster.device=gpu", "cluster.bundles_per_node=2"])
    whole = split_space(gpu)  # a separate pool has the main pool's shape: 2 GPUs each, not changeable
    assert whole is not None and not whole.configurable and whole.unit == "GPUs"
    assert (whole.rollout_share, whole.trainer_share) == (2, 2)
    shared = load_config(
        None,
        [
            *ASYNC[:2],
            "cluster.device=gpu",
            "cluster.gpu_fraction.main=0.5",
            "cluster.gpu_fraction.rollout=0.5",
        ],
    )
    one = split_space(shared)
    assert one is not None and one.grain is None and "compute" in one.note


def test_pools_declaring_more_cpus_than_the_machine_has_are_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measured (docs/async.md): 2:1 on 2 cores ran at half of 1:1, and the advice from that run kept 2:1."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    fits = split_space(load_config(None, [*ASYNC, "cluster.cpus_per_bundle=1"]))
    assert fits is not None and fits.note == ""
    over = split_space(
        load_config(None, [*ASYNC, "cluster.cpus_per_bundle=1", "cluster.pool_cpus.rollout=2"])
    )
    assert over is not None and "3 CPUs on this machine's 2" in over.note and "pool_cpus" in over.note
    remote = [*ASYNC, "cluster.pool_cpus.rollout=2", "cluster.address=10.0.0.1:6379"]
    assert split_space(load_config(None, remote)).note == ""  # type: ignore[union-attr]  # another machine's CPUs


def test_overrides_apply_the_split_and_the_buffer() -> None:
    cfg = load_config(None, [*ASYNC, "cluster.cpus_per_bundle=2", "trainer.max_staleness=1"])
    found = advice_for(cfg, [1.0, 3.0] * 3, [2.0] * 6)  # 2:2 CPUs, generation alternating 1 s and 3 s
    assert found is not None
    advice, space = found
    assert (advice.best.rollout_share, advice.best.trainer_share) == (2, 2)
    assert advice.current.async_buffer == 1  # admission: min(buffer 2, bound 1)
    assert advice_overrides(cfg, advice, space) == ["trainer.async_buffer=2", "trainer.max_staleness=2"]
    bound = advice_for(cfg, [3.0] * 4, [1.0] * 4)
    assert bound is not None
    assert advice_overrides(cfg, *bound)[:2] == ["cluster.pool_cpus.main=1", "cluster.pool_cpus.rollout=3"]


def test_the_run_log_prints_the_advice_once_after_n_steps(caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_config(None, [*ASYNC, "cluster.cpus_per_bundle=2", "trainer.split_advice_after_steps=3"])
    [cb] = split_advice_callbacks(cfg)
    assert isinstance(cb, SplitAdviceLog)
    step = {"kind": "step", "timing_s/step": 3.0, "timing_s/rollout_idle": 0.0, "timing_s/trainer_idle": 2.0}
    with caplog.at_level(logging.WARNING, logger="quartet.trainer.records.split_advice_log"):
        cb.on_record({"kind": "validation"})
        for _ in range(2):
            cb.on_record(step)
        assert cb.line is None and not caplog.records
        cb.on_record(step)
        for _ in range(3):
            cb.on_record(step)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("after 3 steps: split advice (generation-bound now): rollout:trainer 2:2")
    assert "-> 3:1" in line and "cluster.pool_cpus.rollout=3" in line


def test_the_advice_is_attached_only_to_overlapped_runs() -> None:
    assert split_advice_callbacks(load_config(None, ["cluster.device=cpu"])) == []  # sync
    assert split_advice_callbacks(load_config(None, [*ASYNC, "trainer.split_advice_after_steps=0"])) == []
    assert len(split_advice_callbacks(load_config(None, ASYNC))) == 1
    with pytest.raises(ConfigError, match="split_advice_after_steps"):
        load_config(None, ["trainer.split_advice_after_steps=-1"])


def test_the_trainer_carries_the_advice_callback() -> None:
    from quartet.trainer import RLTrainer

    trainer = RLTrainer(load_config(None, ASYNC))
    assert any(isinstance(cb, SplitAdviceLog) for cb in trainer.callbacks.callbacks)


def test_pool_cpus_give_each_pool_its_cpus() -> None:
    from quartet.cluster.pool import ResourcePool

    cfg = load_config(None, ["cluster.pool_cpus.rollout=1", *ASYNC, "cluster.cpus_per_bundle=3"]).cluster
    assert ResourcePool.planned(cfg, "rollout", False).cpus_per_bundle == 1
    assert ResourcePool.planned(cfg, "main", False).cpus_per_bundle == 3
    with pytest.raises(ConfigError, match="pool_cpus.rollout.*no pool of its own"):
        load_config(None, ["cluster.pool_cpus.rollout=1"])
    with pytest.raises(ConfigError, match="pool_cpus.main"):
        load_config(None, ["cluster.pool_cpus.main=-1"])


def test_plan_prints_the_advice_from_step_times_or_asks_for_them() -> None:
    cfg = load_config(None, [*ASYNC, "cluster.cpus_per_bundle=2"])
    assert plan_advice(load_config(None, ["cluster.device=cpu"]), "cpu", "1,1") is None  # sync
    assert "needs measured step times" in str(plan_advice(cfg, "cpu", None))
    line = str(plan_advice(cfg, "cpu", "1,3"))  # training-bound at 2:2 of 4 CPUs
    assert "-> 1:3" in line and "cluster.pool_cpus.main=3 cluster.pool_cpus.rollout=1" in line
    with pytest.raises(ValueError, match="--step-times"):
        plan_advice(cfg, "cpu", "1")
