"""The RL driver: data, workers, the loop over steps, validation, records.

    result = RLTrainer(cfg, on_record=print).run()

One run, in order:
1. resolve the model (build the tiny one when `model.path` is empty) and its tokenizer;
2. load train/val prompts (`data.train_files`/`val_files`, or the built-in task written into the run
   folder), reporting filtered/truncated/bad rows, and a seeded sampler over the training prompts;
3. start the workers (actor + rollout, and the reference/critic/reward model when needed) on one pool;
   with `trainer.resume` finding a checkpoint (`quartet.trainer.checkpoint`), restore the roles, the
   sampler position and the KL controller, and continue with the batch the interrupted run would have used;
4. validate before training (`trainer.val_before_train`, not on resume), then run the steps (`StepRunner`),
   validating every `test_freq` steps and after the last, checkpointing every `save_freq` steps and at the
   end, writing rollout records every `rollout_freq` steps;
5. shut every worker down, whatever happened.

Every record (data report, step metrics, validation, checkpoint) goes to the trackers of `trainer.loggers`
(`quartet.tracking`; `<run dir>/metrics.jsonl` always) and is handed to the callbacks
(`quartet.trainer.callbacks`). The run's Ray names go to `<run dir>/cluster.json` for tools in other
processes.

The run is a session: `_open` prepares what needs no process (plan, resume point, data, sampler), then
starts the trackers, the reward pool and the workers, each entered into one `ExitStack` that closes them
in reverse order however the run ends (a caught failure first checkpoints the last completed step, then
the workers stop, `run_state.json` says failed, the trackers mark the run failed). `run` is the short loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

from quartet.cluster.hostset import add_sentinel, remove_sentinel
from quartet.cluster.naming import RunNames
from quartet.cluster.run_record import mark_failed, mark_finished, mark_running, record_hosts
from quartet.cluster.runtime import connection
from quartet.config import QuartetConfig, plan_step, to_dict, to_yaml
from quartet.core.batch import Batch
from quartet.core.kl import KLController
from quartet.data.sampler import PromptSampler
from quartet.models.loading import load_tokenizer
from quartet.models.resolve import resolve_model
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.tracking import Tracking
from quartet.tracking.run_layout import CONFIG_FILE, HF_DIR, METRICS_FILE
from quartet.trainer.callbacks import CallbackList, OnRecord, Record, RunCallbacks
from quartet.trainer.checkpoint import (
    CheckpointError,
    TrainerState,
    find_resume_checkpoint,
    load_trainer_state,
    save_checkpoint,
)
from quartet.trainer.failure_save import StepBoundary, save_on_failure
from quartet.trainer.memory import PlannedRun, measured_peaks, plan_run
from quartet.trainer.overlapped import make_feed, overlapped_step
from quartet.trainer.rl_data import RLData, prepare_rl_data, prompt_batch
from quartet.trainer.rollout_feed import RolloutFeed
from quartet.trainer.rollout_records import RolloutRecorder
from quartet.trainer.run_files import name_bad_rows, name_reward_failures, prepare_metrics_file
from quartet.trainer.startup import StartupClock
from quartet.trainer.step import StepRunner, kl_controller
from quartet.trainer.validation import validate
from quartet.trainer.workers import Workers, start_workers

__all__ = ["RLResult", "RLTrainer"]

log = logging.getLogger(__name__)


@dataclass
class RLResult:
    """What a finished run reports."""

    run_dir: Path
    steps: int = 0
    validations: list[Record] = field(default_factory=list)
    """Validation records in order: the one before training (step 0) first."""
    last_metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    train_seconds: float = 0.0
    """Time spent in training steps (validation and start-up excluded)."""
    hf_dir: Path | None = None
    """The exported final policy (`trainer.export_final`)."""


@dataclass
class _Prepared:
    """What a run knows before any process starts."""

    planned: PlannedRun
    checkpoint: Path | None
    resumed: TrainerState | None
    model_path: str
    tokenizer: Any
    data: RLData
    sampler: PromptSampler
    kl_ctrl: KLController
    total: int


@dataclass
class _Session:
    """A started run: what `_open` prepared and started, and what the loop updates."""

    prep: _Prepared
    workers: Workers
    reward: Any
    runner: StepRunner
    records: RolloutRecorder
    boundary: StepBoundary
    result: RLResult
    feed: RolloutFeed | None = None
    """Batches generated ahead of the trainer (`trainer.mode` one_step_off/async); None in sync mode."""


class RLTrainer:
    """Runs PPO / GRPO / ... as the config says; see the module docstring.

    on_record: a function given every record (shorthand for `callbacks=OnRecord(fn)`).
    callbacks: `RunCallbacks` (or a list of them): records, when to stop, checkpoint-write hooks.
    console: a rich Console for the console tracker (None: its own).
    """

    def __init__(
        self,
        cfg: QuartetConfig,
        on_record: Callable[[Record], None] | None = None,
        console: Any = None,
        callbacks: RunCallbacks | Sequence[RunCallbacks] = (),
    ) -> None:
        listed = [callbacks] if isinstance(callbacks, RunCallbacks) else list(callbacks)
        self.callbacks = CallbackList(([OnRecord(on_record)] if on_record else []) + listed)
        self.cfg, self.console = cfg, console
        self.tracking: Tracking | None = None
        self.run_dir = cfg.trainer.run_dir
        self.metrics_path = self.run_dir / METRICS_FILE
        self.startup = StartupClock()

    def record(self, kind: str, **values: Any) -> Record:
        """Log a record to every tracker (metrics.jsonl first) and hand it to the callbacks."""
        assert self.tracking is not None, "records are logged while the run is running"
        rec: Record = self.tracking.log({"kind": kind, **values})
        self.callbacks.on_record(rec)
        return rec

    def run(self) -> RLResult:
        start = time.perf_counter()
        with ExitStack() as stack:
            s = self._open(stack)
            first, total = s.result.steps + 1, s.prep.total
            if s.prep.data.val is not None and self.cfg.trainer.val_before_train and s.prep.resumed is None:
                self._validate(s, 0)
            for step in range(first, total + 1):
                self._train_step(s, step)
                stopping = self.callbacks.should_stop(step, step - first + 1)
                if s.prep.data.val is not None and (
                    _every(self.cfg.trainer.test_freq, step) or step == total
                ):
                    self._validate(s, step)
                if _every(self.cfg.trainer.save_freq, step) or step == total or stopping:
                    self._save_completed(s)
                if stopping:
                    break
            self._finish(s)
        s.result.seconds = time.perf_counter() - start
        return s.result

    # ---- the session ------------------------------------------------------------------------------------

    def _prepare(self) -> _Prepared:
        """Everything that needs no process; a run that does not fit, a bad `trainer.resume` or bad data
        fails here, before any worker starts."""
        planned = plan_run(self.cfg)  # may apply the memory plan's proposal (trainer.auto_fit)
        cfg = self.cfg = planned.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = find_resume_checkpoint(cfg.trainer.resume, self.run_dir)
        resumed = load_trainer_state(checkpoint, cfg.cluster.world_size) if checkpoint else None
        prepare_metrics_file(self.metrics_path, resumed.step if resumed else None)
        (self.run_dir / CONFIG_FILE).write_text(to_yaml(cfg))
        model_path = resolve_model(cfg)
        tokenizer = load_tokenizer(cfg.model.tokenizer_path or model_path)
        data = prepare_rl_data(cfg, tokenizer, self.run_dir)
        sampler = PromptSampler(len(data.train), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed)
        kl_ctrl = kl_controller(cfg)
        if resumed is not None:
            sampler.load_state_dict(resumed.sampler)
            kl_ctrl.load_state_dict(resumed.kl_ctrl)
        total = cfg.trainer.total_steps or sampler.steps_per_epoch * cfg.trainer.total_epochs
        return _Prepared(planned, checkpoint, resumed, model_path, tokenizer, data, sampler, kl_ctrl, total)

    def _open(self, stack: ExitStack) -> _Session:
        """Prepare, then start trackers, reward pool and workers, each closed by `stack` in reverse order."""
        clock = self.startup
        prep = clock.timed("prepare", self._prepare)
        cfg, result = self.cfg, RLResult(self.run_dir)
        if prep.resumed is not None:
            result.steps, result.train_seconds = prep.resumed.step, prep.resumed.train_seconds
        t = cfg.trainer  # a logger whose package is missing fails here, before any worker starts
        clock.mark()
        self.tracking = stack.enter_context(
            Tracking(
                t.loggers,
                self.run_dir,
                t.project_name,
                t.experiment_name,
                to_dict(cfg),
                prep.total,
                result.steps,
                self.console,
            )
        )
        self.record(
            "data",
            train=prep.data.train.report.as_dict(),
            val=prep.data.val.report.as_dict() if prep.data.val else None,
            bad_rows_file=name_bad_rows(self.run_dir, prep.data),
        )
        self.record("memory_plan", **prep.planned.record())
        clock.lap("trackers")
        from quartet.rewards.compute import RewardComputer  # the scorer process pool starts here

        reward = RewardComputer(cfg.reward, prep.tokenizer, cfg.data.max_response_length)
        stack.callback(reward.close)
        clock.lap("reward_pool")
        mark_running(self.run_dir)
        stack.push(self._mark_end)
        workers = start_workers(cfg, plan_step(cfg), prep.model_path, self._names(), prep.total)
        clock.lap("workers", workers.start_timing())
        stack.callback(workers.shutdown)
        boundary = StepBoundary(saved_step=result.steps)  # what a caught failure may still checkpoint
        stack.push(partial(self._save_on_failure, workers, boundary))
        self._located(workers)
        if prep.checkpoint is not None:
            self._restore(workers, prep.checkpoint, result.steps, prep.total, prep.resumed)
        tracking = self.tracking

        def on_phase(name: str) -> None:
            boundary.phase(name)
            tracking.phase(name)

        version = prep.resumed.weight_version if prep.resumed is not None else 0
        pad_id = prep.data.train.pad_id
        runner = StepRunner(cfg, workers, reward, prep.kl_ctrl, pad_id, on_phase, version)
        records = RolloutRecorder(cfg, prep.tokenizer, self.run_dir)
        feed = make_feed(cfg, workers, prep.data.train, prep.sampler, prep.total, pad_id)
        if feed is not None:  # a replica failing while the actor trains is reported within a second or so
            add_sentinel(feed.check)
            stack.callback(remove_sentinel, feed.check)
        return _Session(prep, workers, reward, runner, records, boundary, result, feed)

    def _names(self) -> RunNames:
        c = self.cfg.cluster
        return (
            RunNames(c.namespace, c.run_prefix)
            if c.run_prefix
            else RunNames.new(c.namespace, self.cfg.trainer.experiment_name)
        )

    def _located(self, workers: Workers) -> None:
        """Where the run is: names and each rank's node in cluster.json, and which Ray it joined."""
        if self.cfg.cluster.backend == "ray":
            record_hosts(self.run_dir, workers.hosts.names, [workers.hosts, *workers.separate.values()])
            self.record("cluster", ray=connection(), prefix=workers.hosts.names.prefix)

    def _mark_end(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            mark_finished(self.run_dir)
        else:
            mark_failed(self.run_dir, exc)

    def _save_on_failure(
        self,
        workers: Workers,
        boundary: StepBoundary,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """On a failure: the last completed step, when every rank still answers (never raises)."""
        if exc is not None:
            save_on_failure(
                boundary, exc, [workers.hosts, *workers.separate.values()], partial(self._save, workers)
            )

    # ---- the loop ---------------------------------------------------------------------------------------

    def _train_step(self, s: _Session, step: int) -> None:
        data, sampler = s.prep.data, s.prep.sampler
        if s.feed is not None:
            batch, metrics, sampler_state = overlapped_step(s.runner, s.feed, step)
        else:
            prompts = prompt_batch(data.train, sampler.next_indices(), step)

            def more(k: int) -> Batch:  # dynamic sampling's extra draws
                return prompt_batch(data.train, sampler.next_indices(), step, draw=k)

            batch, metrics = s.runner.run(prompts, step, more)
            sampler_state = sampler.state_dict()
        name_reward_failures(self.run_dir, s.reward, data.train, step)
        metrics["training/epoch"] = float(sampler.epoch)
        s.result.train_seconds += metrics["timing_s/step"]
        s.boundary.completed(  # the state of the finished step, before the next one draws prompts
            TrainerState(
                step,
                sampler_state,
                s.prep.kl_ctrl.state_dict(),
                s.result.train_seconds,
                self.cfg.cluster.world_size,
                s.prep.model_path,
                weight_version=s.runner.weight_version,
            )
        )
        s.records.train(batch, step)
        self.record("step", step=step, **metrics)
        s.result.steps, s.result.last_metrics = step, metrics
        if not self.startup.reported:  # the first step of this process: where the time before it went
            self.record("startup", step=step, **self.startup.report(metrics["timing_s/step"]))

    def _validate(self, s: _Session, step: int) -> None:
        assert s.prep.data.val is not None
        val = validate(self.cfg, s.workers, s.prep.data.val, s.reward, step, s.records.val_writer(step))
        name_reward_failures(self.run_dir, s.reward, s.prep.data.val, step)
        s.result.validations.append(self.record("val", step=step, **val))

    def _save_completed(self, s: _Session) -> None:
        if s.boundary.last is not None:
            self._save(s.workers, s.boundary.last)
            s.boundary.saved_step = s.boundary.last.step

    def _finish(self, s: _Session) -> None:
        """After the loop: measured memory next to the plan, and the final export."""
        if s.prep.planned.report is not None and s.result.steps > 0:
            self.record("memory", step=s.result.steps, **s.prep.planned.record(), **measured_peaks(s.workers))
        if self.cfg.trainer.export_final and s.result.steps == s.prep.total:
            s.workers.actor.call(Actor.export_hf, str(self.run_dir / HF_DIR))
            s.result.hf_dir = self.run_dir / HF_DIR

    # ---- checkpoints ------------------------------------------------------------------------------------

    def _save(self, workers: Workers, state: TrainerState) -> Path:
        def save_roles(folder: Path) -> list[str]:
            workers.actor.call(Actor.save, str(folder / "actor"))
            if workers.critic is not None:
                workers.critic.call(Critic.save, str(folder / "critic"))
                return ["actor", "critic"]
            return ["actor"]

        began = time.perf_counter()
        keep = self.cfg.trainer.max_checkpoints_to_keep
        hook = self.callbacks.after_roles_saved
        path = save_checkpoint(self.run_dir, state, to_yaml(self.cfg), save_roles, keep, hook)
        self.record("checkpoint", step=state.step, path=str(path), seconds=time.perf_counter() - began)
        return path

    def _restore(
        self, workers: Workers, checkpoint: Path, step: int, total: int, resumed: TrainerState | None
    ) -> None:
        """Roles' state from `checkpoint`, then the rollout engine gets the restored actor's weights."""
        state = load_trainer_state(checkpoint, self.cfg.cluster.world_size)
        has_critic = workers.critic is not None
        if ("critic" in state.roles) != has_critic:
            raise CheckpointError(
                f"{checkpoint} has roles {state.roles}, but this run {'has' if has_critic else 'has no'} "
                "critic (algorithm.adv_estimator changed?). Fix: resume with the checkpoint's algorithm, or "
                "trainer.resume=off"
            )
        workers.actor.call(Actor.load, str(checkpoint / "actor"))
        if workers.critic is not None:
            workers.critic.call(Critic.load, str(checkpoint / "critic"))
        workers.sync_weights(resumed.weight_version if resumed is not None else 0)
        note = f"resumed from {checkpoint} at step {step} of {total}"
        if step >= total:
            note += (
                ": nothing left to train. Raise trainer.total_steps to go on, or set trainer.resume=off to "
                "start over"
            )
            log.warning(note)
        self.record("resume", step=step, checkpoint=str(checkpoint), note=note)


def _every(freq: int, step: int) -> bool:
    return bool(freq) and step % freq == 0
