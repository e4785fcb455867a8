"""Rollout replicas that recover (`rollout.max_replica_restarts`, `quartet.trainer.recovery`).

Fast: the restart accounting (the limit, the named error past it, the per-step metrics), the count of
samples a replica's share of a split call holds, against the split itself, and the keeper's decisions over
stand-ins for the hosts, a generation and the weight stream (which share is sent again, when a restart
happens, what is not restarted). Slow, on a real local Ray: a replica whose process dies in the middle of
generating step 3 is restarted on its bundle (2 replicas: the survivor rejoins the new weight-sync
group); the run trains every step, every prompt exactly once per epoch (recounted from
the run's own `rollouts/step_N.parquet`), every token within the staleness bound, the new host's pid in
cluster.json, one restart and the dead replica's rows generated again in the metrics. In sync mode, a
replica dying during validation is restarted; with `max_replica_restarts=0` the death ends the run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.cluster.dispatch import Split, split_inputs
from quartet.cluster.errors import WorkerError
from quartet.config import Role, load_config
from quartet.config.errors import ConfigError
from quartet.core.batch import Batch
from quartet.trainer.recovery.replica_keeper import RestartBudget, samples_of


def _death(rank: int = 0) -> WorkerError:
    return WorkerError("rollout", rank, "10.0.0.1 (node ab, pid 42)", "generate(): the actor died: gone")


def test_restarts_are_counted_up_to_the_limit_then_the_death_is_named() -> None:
    budget = RestartBudget(limit=2)
    assert budget.allows(2) and not budget.allows(3)
    budget.take(1, _death())
    budget.take(1, _death(1))
    assert budget.restarts == 2 and not budget.allows(1)
    with pytest.raises(WorkerError) as info:
        budget.take(1, _death(1))
    err = info.value
    assert (err.role, err.rank, err.node) == ("rollout", 1, "10.0.0.1 (node ab, pid 42)")
    assert "the actor died" in err.cause and "rollout.max_replica_restarts=2" in err.cause
    assert budget.restarts == 2  # a refused restart is not counted


def test_a_limit_of_zero_raises_the_death_itself() -> None:
    death = _death()
    with pytest.raises(WorkerError) as info:
        RestartBudget(limit=0).take(1, death)
    assert info.value is death  # today's error, unchanged


def test_step_metrics_are_the_steps_own_and_the_total() -> None:
    budget = RestartBudget(limit=3)
    assert budget.step_metrics() == {
        "async/replica_restarts": 0.0,
        "async/replica_restarts_total": 0.0,
        "async/regenerated_after_failure": 0.0,
        "async/replica_restart_s": 0.0,
    }
    budget.take(1, _death())
    budget.regenerated, budget.seconds = 16, 2.5
    first = budget.step_metrics()
    assert first["async/replica_restarts"] == 1 and first["async/regenerated_after_failure"] == 16
    budget.regenerated += 4
    second = budget.step_metrics()
    assert second["async/replica_restarts"] == 0 and second["async/replica_restarts_total"] == 1
    assert second["async/regenerated_after_failure"] == 4
    assert first["async/replica_restart_s"] == 2.5 and second["async/replica_restart_s"] == 0


class _Split:
    """What `samples_of` reads of a Pending: each rank's arguments and the split's padding."""

    def __init__(self, rows: int, ranks: int) -> None:
        prompts = Batch({"input_ids": torch.arange(rows).unsqueeze(1)})
        self.calls, self.pad = split_inputs(Split.BY_DP_RANK, ranks, (prompts,), {})


@pytest.mark.parametrize(("rows", "ranks"), [(4, 1), (8, 2), (7, 2), (5, 3)])
def test_samples_of_each_share_add_up_to_the_batch(rows: int, ranks: int) -> None:
    split: Any = _Split(rows, ranks)
    shares = [samples_of(split, rank, per_prompt=4) for rank in range(ranks)]
    assert sum(shares) == rows * 4  # the padding rows the split added are not counted
    assert all(share > 0 for share in shares)


def test_samples_of_a_call_without_a_batch_is_zero() -> None:
    split: Any = _Split(4, 1)
    split.calls = [((123.0,), {})]
    assert samples_of(split, 0, per_prompt=4) == 0


# ---- the keeper's logic over stand-ins for the hosts, a generation and the weight stream -----------------


class _Host:
    def __init__(self, rank: int, life: int = 0) -> None:
        self.rank, self.life, self.dead = rank, life, False


class _Hosts:
    def __init__(self, ranks: int) -> None:
        self.handles = [_Host(r) for r in range(ranks)]

    def node_of(self, rank: int) -> str:
        return f"10.0.0.1 (node ab, pid {100 + rank})"


class _Generation:
    """A split generation call: each rank's share went to the host then at that rank; a share sent to a
    dead host has failed, as Ray reports an actor's death."""

    def __init__(self, hosts: _Hosts, rows: int) -> None:
        self.hosts, self.pad = hosts, 0
        self.calls = split_inputs(Split.BY_DP_RANK, len(hosts.handles), (_prompts(rows),), {})[0]
        self.sent_to: list[Any] = list(hosts.handles)
        self.resent: list[int] = []
        self.raises: WorkerError | None = None

    def dead_ranks(self) -> list[int]:
        return [r for r, host in enumerate(self.sent_to) if host.dead]

    def resubmit(self, ranks: list[int]) -> None:
        for rank in ranks:
            self.sent_to[rank] = self.hosts.handles[rank]
        self.resent.extend(ranks)

    def get(self) -> str:
        dead = self.dead_ranks()
        if dead:
            raise WorkerError("rollout", dead[0], self.hosts.node_of(dead[0]), "generate(): the actor died")
        if self.raises is not None:
            raise self.raises
        return "batch"


class _Stream:
    """The weight stream: what the keeper asks of it, recorded."""

    timeout_s = 1.0

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.reopened: list[tuple[int, Any]] = []
        self.synced: list[int] = []
        self.actor = self

    def call(self, fn: Any) -> None:
        self.calls.append(fn.__name__)

    def reopen(self, version: int, apply: Any) -> dict[str, float]:
        self.reopened.append((version, apply))
        return {"weight_sync/version": float(version)}

    def _sync_once(self, version: int, apply: Any, on_failure: Any) -> dict[str, float]:
        self.synced.append(version)
        return {"weight_sync/version": float(version)}


def _prompts(rows: int) -> Batch:
    return Batch({"input_ids": torch.arange(rows).unsqueeze(1)})


def _keeper(monkeypatch: pytest.MonkeyPatch, ranks: int, limit: int) -> tuple[Any, _Hosts, _Stream]:
    from quartet.trainer.recovery import replica_keeper

    def replace(hosts: _Hosts, rank: int) -> None:
        hosts.handles[rank] = _Host(rank, hosts.handles[rank].life + 1)

    monkeypatch.setattr(replica_keeper, "replace_host", replace)
    monkeypatch.setattr(replica_keeper, "_alive", lambda handle: not handle.dead)
    hosts, stream = _Hosts(ranks), _Stream()
    keeper = replica_keeper.ReplicaKeeper(hosts, stream, limit, per_prompt=4)  # type: ignore[arg-type]
    return keeper, hosts, stream


def test_a_share_whose_replica_died_is_restarted_and_sent_again_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quartet.config.rollout import WeightApply

    keeper, hosts, stream = _keeper(monkeypatch, ranks=2, limit=3)
    told: list[list[int]] = []
    keeper.on_restart.append(told.append)
    taking, queued = _Generation(hosts, rows=6), _Generation(hosts, rows=6)
    hosts.handles[1].dead = True
    assert keeper.resolve(taking, version=5) == "batch"
    assert [h.life for h in hosts.handles] == [0, 1]  # rank 1 has a new host; rank 0 kept its own
    assert stream.calls == ["close_weight_stream"] and stream.reopened == [(5, WeightApply.AFTER_DRAIN)]
    assert told == [[1]] and taking.resent == [1]  # only the dead replica's share
    keeper.heal(queued)  # what the feed does for each batch queued ahead, told of the restart
    assert queued.resent == [1] and keeper.budget.restarts == 1  # no second restart for the same death
    metrics = keeper.step_metrics()
    assert metrics["async/replica_restarts"] == 1
    assert metrics["async/regenerated_after_failure"] == 2 * 3 * 4  # 2 shares of 3 prompts x 4 responses


def test_a_death_seen_by_the_sentinel_is_restarted_before_the_next_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keeper, hosts, stream = _keeper(monkeypatch, ranks=1, limit=1)
    ahead = _Generation(hosts, rows=4)
    assert not keeper.tolerates(ahead)  # nothing died: the sentinel names any other failure itself
    hosts.handles[0].dead = True
    assert keeper.tolerates(ahead) and keeper.noticed == {0}
    assert keeper.sync(7, None) == {"weight_sync/version": 7.0}
    assert stream.synced == [] and stream.reopened == [(7, None)]  # the restart's sync is the sync
    assert keeper.budget.restarts == 1 and not keeper.noticed


def test_past_the_limit_the_death_is_named_and_the_sentinel_stops_tolerating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keeper, hosts, _ = _keeper(monkeypatch, ranks=1, limit=1)
    hosts.handles[0].dead = True
    assert keeper.resolve(_Generation(hosts, rows=4), version=1) == "batch"
    hosts.handles[0].dead = True  # the new host dies too
    ahead = _Generation(hosts, rows=4)
    assert not keeper.tolerates(ahead)
    with pytest.raises(WorkerError) as info:
        keeper.resolve(ahead, version=2)
    assert info.value.rank == 0 and "rollout.max_replica_restarts=1" in info.value.cause


def test_a_method_that_raised_in_a_living_replica_is_not_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    keeper, hosts, stream = _keeper(monkeypatch, ranks=1, limit=3)
    failing = _Generation(hosts, rows=4)
    failing.raises = WorkerError("rollout", 0, "n", "generate() raised ValueError: bad prompt")
    with pytest.raises(WorkerError, match="bad prompt"):
        keeper.resolve(failing, version=1)
    assert keeper.budget.restarts == 0 and stream.reopened == []


def test_the_healing_view_restarts_inside_its_calls_and_sends_the_calls_in_flight_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from quartet.config.rollout import WeightApply
    from quartet.trainer.recovery.healing import HealingRollout, RecoveringSync
    from quartet.trainer.workers.rollout_calls import RolloutCalls

    keeper, hosts, stream = _keeper(monkeypatch, ranks=2, limit=3)
    generations: list[_Generation] = []

    class _Group:
        def submit_batch(self, fn: Any, *args: Any, **kwargs: Any) -> _Generation:
            generations.append(_Generation(hosts, rows=6))
            return generations[-1]

    view = HealingRollout(keeper, RolloutCalls(_Group()))  # type: ignore[arg-type]
    assert RecoveringSync(keeper).sync(4) == {"weight_sync/version": 4.0}  # every sync goes through it
    queued = view.submit_batch(lambda rollout: rollout)  # type: ignore[arg-type,return-value]
    hosts.handles[1].dead = True
    queued.raise_if_failed()  # the sentinel only notes a death the view will heal
    assert view.call_batch(lambda rollout: rollout) == "batch"  # type: ignore[arg-type,return-value,comparison-overlap]
    assert stream.reopened == [(4, WeightApply.AFTER_DRAIN)]  # restarted at the weights synced last
    assert [g.resent for g in generations] == [[1], [1]]  # the queued call was sent again too
    assert view.step_metrics()["async/replica_restarts"] == 1
    assert RolloutCalls(_Group()).step_metrics() == {}  # type: ignore[arg-type]  # the plain view has none


def test_the_key_is_checked() -> None:
    assert load_config(None, []).rollout.max_replica_restarts == 3
    with pytest.raises(ConfigError, match="max_replica_restarts"):
        load_config(None, ["rollout.max_replica_restarts=-1"])


# ---- on a real local Ray --------------------------------------------------------------------------------

BASE = [
    "data.train_batch_size=4",
    "data.builtin_train_size=16",  # 4 steps an epoch
    "data.builtin_val_size=8",
    "data.max_response_length=8",
    "rollout.n=4",
    "actor.mini_batch_size=4",
    "actor.micro_batch_size_per_device=8",
    "actor.mixed_precision=float32",
    "algorithm.adv_estimator=grpo",
    "cluster.namespace=quartet-tests",
    "cluster.cpus_per_bundle=0.5",
    "cluster.separate_pools=[rollout]",
    "trainer.loggers=[jsonl]",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.export_final=false",
    "trainer.save_freq=0",
    "trainer.rollout_freq=1",  # every step's samples, per token, to rollouts/step_N.parquet
    "trainer.rollout_samples=0",
]
CRASH_STEP = 3


def _crash_at_step(group: Any, step: int, validation: bool = False) -> None:
    """Make replica rank 0 of `group` kill its own process when it starts generating its share of step
    `step`'s prompts (an engine crash that takes the process down, at a known moment: that batch is in
    flight). A restarted replica is built afresh, without this. Defined here, so Ray pickles it by value."""

    def install(role: Any) -> None:
        import os
        import signal

        if os.environ.get("RANK") != "0":
            return
        real = role.generator.generate

        def generate(prompts: Batch, sampling: Any) -> Batch:
            if prompts.meta.global_step == step and prompts.meta.validation == validation:
                os.kill(os.getpid(), signal.SIGKILL)
            out: Batch = real(prompts, sampling)
            return out

        role.generator.generate = generate

    group.execute(install)


def _crashing_run(
    monkeypatch: pytest.MonkeyPatch,
    tiny_model_dir: Path,
    tmp_path: Path,
    *overrides: str,
    validation: bool = False,
) -> tuple[Any, list[int]]:
    """The run's config, with its replica rank 0 set to crash at CRASH_STEP (its training batch, or with
    `validation` the validation after that step); the replicas' first pids (filled when the run starts
    its workers)."""
    from quartet.trainer.loop import session

    real_start, pids = session.start_workers, list[int]()  # type: ignore[attr-defined]

    def start(*args: Any, **kwargs: Any) -> Any:
        workers = real_start(*args, **kwargs)
        pids.extend(int(n["pid"]) for n in workers.separate[Role.ROLLOUT].nodes)
        _crash_at_step(workers.rollout, CRASH_STEP, validation)
        return workers

    monkeypatch.setattr(session, "start_workers", start)
    paths = [f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
    return load_config(None, [*BASE, *paths, *overrides]), pids


@pytest.mark.ray
# not `slow`: issue 38 asks for this check in CI
def test_a_replica_that_dies_mid_generation_is_restarted_and_no_prompt_is_lost(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Async, 2 replicas (and 2 actor ranks): replica 0 dies as it starts its share of step 3. The
    survivor leaves the weight-sync group and joins the new one, and only the dead replica's shares (2
    prompts of each batch) are generated again."""
    import pyarrow.parquet as pq

    from quartet.trainer.loop.rl_trainer import RLTrainer

    replicas = 2
    cfg, first_pids = _crashing_run(
        monkeypatch,
        tiny_model_dir,
        tmp_path,
        "trainer.mode=async",
        "trainer.total_steps=8",
        f"cluster.bundles_per_node={replicas}",
    )
    records: list[dict[str, Any]] = []
    assert RLTrainer(cfg, on_record=records.append).run().steps == 8
    steps = {r["step"]: r for r in records if r["kind"] == "step"}
    assert sorted(steps) == list(range(1, 9))
    assert sum(r["async/replica_restarts"] for r in steps.values()) == 1
    assert steps[8]["async/replica_restarts_total"] == 1
    share = 16 // replicas  # samples of one replica's share of a batch: its prompts x 4 responses
    regenerated = sum(r["async/regenerated_after_failure"] for r in steps.values())
    assert regenerated >= share and regenerated % share == 0, regenerated  # whole shares, the crashed one
    drawn: list[set[int]] = [set(), set()]
    for step in range(1, 9):
        rows = pq.read_table(cfg.trainer.run_dir / "rollouts" / f"step_{step}.parquet").to_pylist()
        assert len(rows) == 16, f"step {step}: {len(rows)} samples"  # none lost, none twice
        groups = {(row["uid"], row["index"]) for row in rows}
        assert all(sum(1 for r in rows if r["uid"] == uid) == 4 for uid, _ in groups)
        epoch = drawn[(step - 1) // 4]
        assert len(groups) == 4 and not {index for _, index in groups} & epoch, f"step {step} repeats"
        epoch.update(index for _, index in groups)
        lags = [step - 1 - v for row in rows for v, m in zip(row["versions"], row["mask"], strict=True) if m]
        bound = cfg.trainer.max_staleness
        assert min(lags) >= 0 and max(lags) <= bound, f"step {step}: lags {sorted(set(lags))}"
    assert drawn == [set(range(16)), set(range(16))]  # every prompt exactly once per epoch
    ranks = json.loads((cfg.trainer.run_dir / "cluster.json").read_text())["ranks"]["rollout"]
    assert len(first_pids) == len(ranks) == replicas
    assert ranks[0]["pid"] != first_pids[0]  # the run's own record names the new host
    assert [r["pid"] for r in ranks[1:]] == first_pids[1:]  # the survivor was left in place


@pytest.mark.ray
@pytest.mark.slow
def test_a_replica_that_dies_during_validation_is_restarted_in_sync_mode(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sync mode with the rollout on a pool of its own takes the same path (a generation resolved by the
    keeper): the replica dies as it starts the validation after step 3."""
    from quartet.trainer.loop.rl_trainer import RLTrainer

    cfg, _ = _crashing_run(
        monkeypatch,
        tiny_model_dir,
        tmp_path,
        "trainer.mode=sync",
        "trainer.total_steps=6",
        f"trainer.test_freq={CRASH_STEP}",
        validation=True,
    )
    records: list[dict[str, Any]] = []
    assert RLTrainer(cfg, on_record=records.append).run().steps == 6
    vals = [r for r in records if r["kind"] == "val"]
    assert [r["step"] for r in vals] == [CRASH_STEP, 6]
    assert all(any(k.startswith("val-core/") for k in r) for r in vals)
    steps = [r for r in records if r["kind"] == "step"]
    assert sum(r["async/replica_restarts"] for r in steps) == 1
    # validation samples one greedy response per prompt (rollout.val.n=1): its 8 prompts, at least
    assert sum(r["async/regenerated_after_failure"] for r in steps) >= 8


@pytest.mark.ray
@pytest.mark.slow
def test_without_restarts_the_same_death_ends_the_run_naming_the_replica(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from quartet.trainer.loop.rl_trainer import RLTrainer

    cfg, _ = _crashing_run(
        monkeypatch,
        tiny_model_dir,
        tmp_path,
        "trainer.mode=async",
        "trainer.total_steps=8",
        "rollout.max_replica_restarts=0",
    )
    records: list[dict[str, Any]] = []
    with pytest.raises(WorkerError) as info:
        RLTrainer(cfg, on_record=records.append).run()
    assert info.value.role == "rollout" and info.value.rank == 0, str(info.value)
    assert "died" in str(info.value)
    trained = [r["step"] for r in records if r["kind"] == "step"]
    assert max(trained, default=0) < CRASH_STEP  # nothing trained past the crash
    assert all("async/replica_restarts" not in r for r in records if r["kind"] == "step")
