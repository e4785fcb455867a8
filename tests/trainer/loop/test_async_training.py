"""Disaggregated rollout on a real local Ray: the rollout on a pool of its own, weights streamed across
processes, and the overlapped modes (`trainer.mode=one_step_off|async`).

Checked from the outside and against independent computations: the engine's weights after a sync equal the
actor's tensor by tensor, bit for bit; the engine's log-probs equal the trainer's recomputation within 1e-5
(fp32); over a 20-step async run with the drop policy, and over 16 steps of admission control with some
responses 10x longer, no trained token is older than `trainer.max_staleness` (every token's version
recounted here); a resumed async run draws exactly the prompts of the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.cluster.errors import WorkerError
from quartet.cluster.hostset import live_runs
from quartet.cluster.naming import RunNames
from quartet.config import QuartetConfig, load_config, plan_step
from quartet.core.batch import Batch
from quartet.models.loading import load_tokenizer
from quartet.rewards.compute import RewardComputer
from quartet.roles.actor import Actor
from quartet.roles.rollout import Rollout
from quartet.trainer.feed.batch_source import BatchSource, RolloutScorer, SyncGeneration
from quartet.trainer.feed.rl_data import prepare_rl_data, prompt_batch
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.loop.step import StepRunner, TrainedStep, kl_controller
from quartet.trainer.records.callbacks import RunCallbacks, StopAfter
from quartet.trainer.workers.start import start_workers
from quartet.trainer.workers.weight_sync import open_weight_sync

pytestmark = pytest.mark.ray

BASE = [
    "data.train_batch_size=4",
    "data.builtin_train_size=64",
    "data.builtin_val_size=8",
    "data.max_response_length=8",
    "rollout.n=4",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size_per_device=16",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-2",
    "actor.entropy_coeff=0.05",  # a gradient on every step, so the weights (and versions) really move
    "algorithm.adv_estimator=grpo",
    "cluster.namespace=quartet-tests",
    "cluster.cpus_per_bundle=0.5",
    "cluster.separate_pools=[rollout]",
    "trainer.loggers=[jsonl]",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.export_final=false",
]


def _config(tiny_model_dir: Path, tmp_path: Path, *overrides: str) -> QuartetConfig:
    paths = [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
    return load_config(None, [*BASE, *paths, *overrides])


# auto: gloo here (no CUDA); shm: the buckets as shared-memory handles between two Ray workers (unrelated
# processes), the protocol of CUDA IPC (quartet.weight_sync.shared): its wiring end to end on CPU, slow
# (~55 s here) because it repeats the whole run for the transport alone
@pytest.mark.parametrize("transport", ["auto", pytest.param("shm", marks=pytest.mark.slow)])
def test_cross_process_sync_is_bitwise_and_logprobs_match(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, transport: str
) -> None:
    cfg = _config(tiny_model_dir, tmp_path, f"rollout.weight_sync.transport={transport}")
    workers = start_workers(
        cfg, plan_step(cfg), str(tiny_model_dir), RunNames.new("quartet-tests", "sync"), 2
    )
    tokenizer = load_tokenizer(str(tiny_model_dir))
    reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
    try:
        pids = {g: getattr(workers, g).execute(lambda _: os.getpid())[0] for g in ("actor", "rollout")}
        assert pids["actor"] != pids["rollout"]  # two processes: the weights cross a process boundary
        data = prepare_rl_data(cfg, tokenizer, tmp_path)
        runner = StepRunner(cfg, workers, open_weight_sync(cfg, workers), kl_controller(cfg))
        scorer = RolloutScorer(cfg, workers.reward_model, reward)
        source = SyncGeneration(
            cfg,
            workers,
            scorer,
            lambda step, k: prompt_batch(data.train, list(range(4 * step - 4, 4 * step)), step),
        )
        before = _weights(workers.actor, "module")
        for step in (1, 2):
            metrics = runner.run(source, step).metrics
            assert metrics["weight_sync/version"] == step and metrics["weight_sync/bytes"] > 0
            assert metrics["weight_sync/cuda_ipc"] == 0.0  # no CUDA here, whatever the setting
            assert metrics["weight_sync/shared"] == float(transport == "shm")
        actor, engine = _weights(workers.actor, "module"), _weights(workers.rollout, "model")
        assert any(not torch.equal(before[k], actor[k]) for k in actor)  # the update moved them
        assert sorted(actor) == sorted(engine)
        unequal = [
            k for k in actor if not torch.equal(actor[k], engine[k]) or actor[k].dtype != engine[k].dtype
        ]
        assert not unequal, f"tensors that differ after the sync: {unequal}"
        assert workers.rollout.call(Rollout.weight_version) == [2]
        # the engine's sampling log-probs against the trainer's own pass over the same tokens
        prompts = prompt_batch(data.train, list(range(40, 44)), 3)
        rollout = workers.rollout.call_batch(Rollout.generate, prompts)
        assert rollout["rollout_versions"][rollout["response_mask"].bool()].eq(2).all()
        trainer = workers.actor.call_batch(Actor.compute_logprobs, rollout)
        mask = rollout["response_mask"].bool()
        diff = (trainer["old_logprobs"] - rollout["rollout_logprobs"]).abs()[mask]
        assert mask.sum() > 0 and float(diff.max()) < 1e-5
    finally:
        reward.close()
        workers.shutdown()


def _weights(group: Any, attribute: str) -> dict[str, torch.Tensor]:
    """Rank 0's full parameters of `role.engine.<attribute>` (cloned). Defined here, so Ray pickles it by
    value: the worker processes cannot import this test module."""

    def grab(role: Any) -> dict[str, torch.Tensor]:
        module = getattr(role.engine, attribute)
        return {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for n, p in module.named_parameters()
        }

    return group.execute(grab)[0]


_REAL_RUN = StepRunner.run


class _Batches:
    """Wraps `StepRunner.run` to keep each step's trained batch and the trainer's version before it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: dict[int, tuple[Batch, int]] = {}

        def run(runner: StepRunner, source: BatchSource, step: int) -> TrainedStep:
            version = runner.weight_version
            trained = _REAL_RUN(runner, source, step)
            self.steps[step] = (trained.batch, version)
            return trained

        monkeypatch.setattr(StepRunner, "run", run)

    def prompts(self, step: int) -> list[tuple[int, ...]]:
        """The distinct prompts (token ids) of a step, in row order."""
        batch, _ = self.steps[step]
        seen: dict[str, tuple[int, ...]] = {}
        for i, uid in enumerate(batch.non_tensors["uid"]):
            ids = batch["prompts"][i][batch["attention_mask"][i, : batch["prompts"].shape[1]].bool()]
            seen.setdefault(str(uid), tuple(ids.tolist()))
        return list(seen.values())


@pytest.mark.slow
def test_async_drop_policy_never_trains_on_tokens_older_than_the_bound(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches = _Batches(monkeypatch)
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        "trainer.mode=async",
        "trainer.staleness_control=drop",  # admission would never let a group get too old
        "trainer.max_staleness=1",
        "trainer.async_buffer=2",  # two batches ahead: some groups come back two versions old
        "trainer.total_steps=20",
        "trainer.save_freq=0",
    )
    records: list[dict[str, Any]] = []
    result = RLTrainer(cfg, on_record=records.append).run()
    assert result.steps == 20 and sorted(batches.steps) == list(range(1, 21))
    lags = []
    for step, (batch, version) in batches.steps.items():
        mask = batch["response_mask"].bool()
        assert mask.any()
        lag = version - batch["rollout_versions"][mask]
        assert int(lag.min()) >= 0, f"step {step}: a token from the future"
        assert int(lag.max()) <= 1, f"step {step}: a token {int(lag.max())} versions old"
        assert len(batch) == 16  # dropped groups were generated again, none lost
        lags.append(int(lag.max()))
    steps = [r for r in records if r["kind"] == "step"]
    dropped = sum(r["async/dropped_stale"] for r in steps)
    assert dropped > 0, "the bound never had to act: the test would not see a violation"
    assert max(lags) == 1  # and the feed does run one version behind
    assert [r["async/staleness_max"] for r in steps] == lags
    assert all(0.0 <= r["perf/overlap"] <= 1.0 for r in steps)
    assert steps[-1]["weight_sync/version"] == 20
    # weights arrive while batches generate: only rows sampled wholly with the trainer's version are
    # compared, and those match, so the log-prob mismatch alarm stays quiet
    assert [r["alarm/mismatch"] for r in steps] == [0.0] * 20
    assert not [r for r in records if r["kind"] == "alarm" and r["alarm"] == "mismatch"]


LONG, SHORT = 40, 4  # response lengths of the admission run: a quarter of the prompts 10x longer


def _skewed_lengths(group: Any) -> None:
    """Make every replica of `group` answer dataset rows whose index is a multiple of 4 with exactly LONG
    tokens and the others with exactly SHORT (end-of-sequence ignored): skew decided by the prompt, not
    sampled. Defined here, so Ray pickles it by value."""

    def install(role: Any) -> None:
        import dataclasses

        from quartet.roles.rollout.generators import Generator
        from quartet.rollout.batch_io import outputs_to_batch, requests_from_batch

        class Skewed(Generator):
            def generate(self, prompts: Batch, sampling: Any) -> Batch:
                requests = requests_from_batch(prompts, dataclasses.replace(sampling, ignore_eos=True))
                for i, index in enumerate(prompts.non_tensors["index"]):
                    cap = LONG if int(index) % 4 == 0 else SHORT
                    own = dataclasses.replace(requests[i].sampling, max_new_tokens=cap)
                    requests[i] = dataclasses.replace(requests[i], sampling=own)
                outputs = role.engine.generate(requests)
                return outputs_to_batch(prompts, outputs, role.pad_token_id, sampling.temperature)

        role.generator = Skewed()

    group.execute(install)


@pytest.mark.slow
def test_admission_run_with_skewed_lengths_drops_nothing_and_keeps_the_bound(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16 async steps (2 epochs) under admission control with the buffer deeper than the bound, recounted
    from the run's own rollout tables: every token's version against the step's, every prompt per epoch."""
    import pyarrow.parquet as pq

    from quartet.trainer.loop import session

    real_start = session.start_workers

    def start(*args: Any, **kwargs: Any) -> Any:
        workers = real_start(*args, **kwargs)
        _skewed_lengths(workers.rollout)
        return workers

    monkeypatch.setattr(session, "start_workers", start)
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        "trainer.mode=async",
        "trainer.max_staleness=1",
        "trainer.async_buffer=3",  # the buffer alone would let batches come back 3 versions old
        "data.builtin_train_size=32",  # 8 steps an epoch
        f"data.max_response_length={LONG}",
        "trainer.total_steps=16",
        "trainer.save_freq=0",
        "trainer.rollout_freq=1",  # every step's samples, per token, to rollouts/step_N.parquet
        "trainer.rollout_samples=0",
    )
    records: list[dict[str, Any]] = []
    assert RLTrainer(cfg, on_record=records.append).run().steps == 16
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    assert sorted(steps) == list(range(1, 17))
    drawn: list[set[int]] = [set(), set()]
    for step, record in steps.items():
        assert record["async/dropped_stale"] == 0 and record["async/admission_wait_s"] >= 0
        assert record["weight_sync/version"] == step  # one update a step: step s trains at version s - 1
        rows = pq.read_table(cfg.trainer.run_dir / "rollouts" / f"step_{step}.parquet").to_pylist()
        assert len(rows) == 16  # 4 prompts x 4 responses, none lost
        lags = [step - 1 - v for row in rows for v, m in zip(row["versions"], row["mask"], strict=True) if m]
        assert min(lags) >= 0 and max(lags) <= 1, f"step {step}: lags {sorted(set(lags))}"
        assert record["async/staleness_max"] == max(lags)
        for row in rows:
            assert row["response_tokens"] == (LONG if row["index"] % 4 == 0 else SHORT), row["index"]
        groups = {(row["uid"], row["index"]) for row in rows}
        epoch = drawn[(step - 1) // 8]
        assert len(groups) == 4 and not {index for _, index in groups} & epoch, f"step {step} repeats"
        epoch.update(index for _, index in groups)
    assert drawn == [set(range(32)), set(range(32))]  # every prompt exactly once per epoch
    assert steps[16]["async/dropped_stale_total"] == 0
    # the buffer (3) had room for batches the bound (1) held back: admission did act, from step 2 on
    assert all(steps[s]["async/admission_wait_s"] > 0 for s in range(2, 16))


@pytest.mark.slow
def test_resumed_async_run_draws_the_prompts_of_the_uninterrupted_one(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["trainer.mode=async", "trainer.async_buffer=2", "trainer.total_steps=6", "trainer.save_freq=0"]
    whole = _Batches(monkeypatch)
    RLTrainer(_config(tiny_model_dir, tmp_path / "whole", *common)).run()
    first = _Batches(monkeypatch)
    cut = _config(tiny_model_dir, tmp_path / "cut", *common)
    stopped = RLTrainer(cut, callbacks=StopAfter(3)).run()  # steps 4 and 5 were already drawn ahead
    assert stopped.steps == 3
    rest = _Batches(monkeypatch)
    resumed = RLTrainer(cut).run()
    assert resumed.steps == 6 and sorted(rest.steps) == [4, 5, 6]
    for step in range(1, 7):
        again = first if step <= 3 else rest
        assert again.prompts(step) == whole.prompts(step), f"step {step} drew other prompts"
    assert len({p for s in range(1, 7) for p in whole.prompts(s)}) > 4  # the steps drew different prompts


class _AtStep(RunCallbacks):
    """Runs `action(rollout_hosts)` once, when the record of step `step` arrives."""

    def __init__(self, step: int, action: Any) -> None:
        self.step, self.action, self.done_at = step, action, 0.0

    def on_record(self, record: dict[str, Any]) -> None:
        if record["kind"] == "step" and record["step"] == self.step and not self.done_at:
            hosts = next(h for h in live_runs().values() if h.label == "rollout")
            self.action(hosts)
            self.done_at = time.monotonic()


@pytest.mark.slow
def test_a_replica_that_dies_is_named_within_seconds(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import ray

    kill = _AtStep(2, lambda hosts: ray.kill(hosts.handles[0], no_restart=True))
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        "trainer.mode=async",
        "trainer.total_steps=40",
        "trainer.save_freq=0",
        "rollout.max_replica_restarts=0",  # else restarted (tests/trainer/recovery/test_replica_recovery.py)
    )
    with pytest.raises(WorkerError) as info:
        RLTrainer(cfg, callbacks=kill).run()
    seconds = time.monotonic() - kill.done_at
    assert kill.done_at and seconds < 10, f"reported {seconds:.1f} s after the replica died"
    assert info.value.role == "rollout" and info.value.rank == 0, str(info.value)


@pytest.mark.slow
def test_a_hung_replica_fails_the_sync_naming_version_and_bytes(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    stopped: list[int] = []

    def freeze(hosts: Any) -> None:  # the replica's process stops answering, as a wedged one would
        time.sleep(1.0)  # step 3's batch (generating ahead) is done by then: the sync is what meets the hang
        stopped.append(int(hosts.nodes[0]["pid"]))
        os.kill(stopped[0], signal.SIGSTOP)

    hang = _AtStep(2, freeze)
    cfg = _config(
        tiny_model_dir,
        tmp_path,
        "trainer.mode=one_step_off",
        "trainer.total_steps=6",
        "trainer.save_freq=0",
        "rollout.weight_sync.timeout_s=3",
        "cluster.call_timeout_s=60",
    )
    try:
        with pytest.raises(WorkerError) as info:
            RLTrainer(cfg, callbacks=hang).run()
    finally:
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    seconds = time.monotonic() - hang.done_at
    message = str(info.value)
    assert info.value.role == "rollout" and "version 3" in message, message
    assert "bytes" in message, message
    # the sync's 3 s, the driver's 10 s of grace, the bounded engine shutdown (10 s) and slack
    assert seconds < 3 + 10 + 10 + 5, f"the run failed {seconds:.1f} s after the replica hung"
