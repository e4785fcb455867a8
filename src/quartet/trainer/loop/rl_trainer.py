"""The RL driver: data, workers, the loop over steps, validation, records.

    result = RLTrainer(cfg, on_record=print).run()

One run, in order:
1. resolve the model (build the tiny one when `model.path` is empty) and its tokenizer;
2. load train/val prompts (`data.train_files`/`val_files`, or the built-in task written into the run
   folder), reporting filtered/truncated/bad rows, and a seeded sampler over the training prompts;
3. start the workers (actor + rollout, and the reference/critic/reward model when needed) on one pool;
   with `trainer.resume` finding a checkpoint (`quartet.trainer.recovery.checkpoint`), restore the roles, the
   sampler position and the KL controller, and continue with the batch the interrupted run would have used;
4. validate before training (`trainer.val_before_train`, not on resume), then run the steps (`StepRunner`),
   validating every `test_freq` steps and after the last, checkpointing every `save_freq` steps and at the
   end, writing rollout records every `rollout_freq` steps;
5. shut every worker down, whatever happened.

Preemption (`trainer.preempt_grace_s`, `quartet.trainer.recovery.preemption`): after SIGTERM or SIGUSR1 the
loop stops at its next safe point (the end of the running step, or the step's next phase boundary when it
cannot finish within the grace and no update began), checkpoints the last completed step, records
`preempt`, and the run returns with `RLResult.preempted` set (`quartet train` exits with
`trainer.preempt_exit_code`).

Every record (data report, step metrics, validation, checkpoint) goes to the trackers of `trainer.loggers`
(`quartet.tracking`; `<run dir>/metrics.jsonl` always) and is handed to the callbacks
(`quartet.trainer.records.callbacks`). The run's Ray names go to `<run dir>/cluster.json` for tools in other
processes.

The run is a session: `_open` prepares what needs no process (plan, resume point, data, sampler), then
starts the trackers, the reward pool, the workers and their weight sync, and the batch source of
`trainer.mode` (`quartet.trainer.loop.session` holds these openers), each entered into one `ExitStack` that
closes them in reverse order however the run ends (a caught failure first checkpoints the last completed
step, then the workers stop, `run_state.json` says failed, the trackers mark the run failed). `run` is the
short loop; every mode runs the same step (`StepRunner.run` over a `BatchSource`).
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

from quartet.config import QuartetConfig, to_dict, to_yaml
from quartet.rewards.callables import RewardFuncs
from quartet.tracking import Tracking
from quartet.tracking.run_layout import HF_DIR, METRICS_FILE
from quartet.trainer.feed.batch_source import BatchSource
from quartet.trainer.feed.run_files import name_bad_rows, name_reward_failures
from quartet.trainer.loop.mismatch_alarm import MismatchAlarm
from quartet.trainer.loop.no_signal_alarm import NoSignalAlarm
from quartet.trainer.loop.session import (
    Prepared,
    actor_layout,
    mark_run,
    open_batch_source,
    prepare_run,
    record_location,
    start_roles,
)
from quartet.trainer.loop.step import StepRunner
from quartet.trainer.loop.validation import validate
from quartet.trainer.records.callbacks import CallbackList, OnRecord, Record, RunCallbacks
from quartet.trainer.records.memory import measured_peaks
from quartet.trainer.records.rollout_records import RolloutRecorder
from quartet.trainer.records.split_advice_log import split_advice_callbacks
from quartet.trainer.records.startup import StartupClock
from quartet.trainer.recovery.checkpoint import TrainerState, save_checkpoint, world_change
from quartet.trainer.recovery.failure_save import StepBoundary, save_on_failure
from quartet.trainer.recovery.preemption import Preemption, PreemptionNotice, StepAbandoned
from quartet.trainer.recovery.role_state import export_policy, restore_roles, save_roles
from quartet.trainer.workers.start import Workers
from quartet.trainer.workers.weight_sync import WeightSync

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
    resumed_at: int | None = None
    """The step the run resumed after (`trainer.resume`), None for a fresh start."""
    total_steps: int = 0
    """The steps the run was asked for (`trainer.total_steps`, or the epochs' worth)."""
    preempted: PreemptionNotice | None = None
    """Set when a preemption signal stopped the run (its last completed step checkpointed)."""

    @property
    def steps_this_run(self) -> int:
        """Steps trained by this call (a resumed run's earlier steps excluded)."""
        return self.steps - (self.resumed_at or 0)


@dataclass
class _Session:
    """A started run: what `_open` prepared and started, and what the loop updates."""

    prep: Prepared
    workers: Workers
    reward: Any
    runner: StepRunner
    source: BatchSource
    """Where each step's scored batch comes from (`trainer.mode`)."""
    records: RolloutRecorder
    boundary: StepBoundary
    result: RLResult
    preempt: Preemption
    times: _Times


@dataclass
class _Times:
    """What the preemption check at a phase boundary estimates from: this process's measured times."""

    step: int = 0
    """The running step."""
    step_began: float = 0.0
    """`time.perf_counter()` at the start of the running step."""
    step_s: float | None = None
    """The last completed step's wall time (None: none yet in this process)."""
    save_s: float = 0.0
    """The last checkpoint's write time (0: none yet in this process)."""
    abandoned: str = ""
    """The step and phase a preemption abandoned, if it did."""

    @property
    def estimate(self) -> tuple[float | None, float]:
        """(step seconds, save seconds) for `Preemption.step_fits`."""
        return self.step_s, self.save_s


class RLTrainer:
    """Runs PPO / GRPO / ... as the config says; see the module docstring.

    on_record: a function given every record (shorthand for `callbacks=OnRecord(fn)`).
    callbacks: `RunCallbacks` (or a list of them): records, when to stop, checkpoint-write hooks.
    console: a rich Console for the console tracker (None: its own).
    reward_funcs: reward functions as plain callables, TRL's `fn(prompts, completions, **kwargs) ->
        list[float]` or verl's `fn(data_source, solution_str, ground_truth, extra_info) -> float`, summed
        (weighted by `reward_weights`, default 1 each) in place of `reward.function`
        (`quartet.rewards.callables`; they are pickled to the scoring processes with cloudpickle).
    """

    def __init__(
        self,
        cfg: QuartetConfig,
        on_record: Callable[[Record], None] | None = None,
        console: Any = None,
        callbacks: RunCallbacks | Sequence[RunCallbacks] = (),
        reward_funcs: Sequence[Callable[..., Any]] | None = None,
        reward_weights: Sequence[float] | None = None,
    ) -> None:
        self.reward_funcs: RewardFuncs | None = None
        if reward_funcs is not None:  # signatures and weights are checked here, before anything starts
            self.reward_funcs = RewardFuncs(reward_funcs, reward_weights)
        elif reward_weights is not None:
            raise ValueError("reward_weights without reward_funcs: pass the functions they weigh")
        listed = [callbacks] if isinstance(callbacks, RunCallbacks) else list(callbacks)
        advice = split_advice_callbacks(cfg)  # the run log's split advice, after a few overlapped steps
        self.callbacks = CallbackList(([OnRecord(on_record)] if on_record else []) + listed + advice)
        self.cfg = cfg
        self.console = console
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
                if s.preempt.requested:  # came between steps (validation, a save, the start)
                    break
                try:
                    self._train_step(s, step)
                except StepAbandoned as abandoned:
                    s.times.abandoned = str(abandoned)
                    break
                if s.preempt.requested:
                    break
                stopping = self.callbacks.should_stop(step, step - first + 1)
                if s.prep.data.val is not None and (
                    _every(self.cfg.trainer.test_freq, step) or step == total
                ):
                    self._validate(s, step)
                if _every(self.cfg.trainer.save_freq, step) or step == total or stopping:
                    self._save_completed(s)
                if stopping:
                    break
            if s.preempt.requested:
                self._preempted(s)
            else:
                self._finish(s)
        s.result.seconds = time.perf_counter() - start
        return s.result

    # ---- the session ------------------------------------------------------------------------------------

    def _prepare(self) -> Prepared:
        prep = prepare_run(self.cfg, self.run_dir, self.metrics_path, rules_score=self.reward_funcs is None)
        self.cfg = prep.cfg  # the memory plan's proposal, where trainer.auto_fit applied it
        return prep

    def _open(self, stack: ExitStack) -> _Session:
        """Prepare, then start trackers, reward pool and workers, each closed by `stack` in reverse order."""
        clock = self.startup
        preempt = _preemption(stack, self.cfg)
        prep = clock.timed("prepare", self._prepare)
        cfg = self.cfg
        result = RLResult(self.run_dir, total_steps=prep.total)
        if prep.resumed is not None:
            result.resumed_at = prep.resumed.step
            result.steps = prep.resumed.step
            result.train_seconds = prep.resumed.train_seconds
        clock.mark()
        self._open_tracking(stack, prep, result.steps)
        clock.lap("trackers")
        from quartet.rewards.compute import RewardComputer  # the scorer process pool starts here

        reward = RewardComputer(
            cfg.reward,
            prep.tokenizer,
            cfg.data.max_response_length,
            reward_funcs=self.reward_funcs,
            run_dir=self.run_dir,
        )
        stack.callback(reward.close)
        clock.lap("reward_pool")
        mark_run(stack, self.run_dir)
        roles = start_roles(stack, cfg, prep)
        preempt.claim()  # a Ray connected just now replaced the SIGTERM handler
        workers = roles.workers
        weights = roles.weights
        clock.lap("workers", workers.start_timing())
        boundary = StepBoundary(saved_step=result.steps)  # what a caught failure may still checkpoint
        preempt.saved_step = result.steps
        times = _Times()
        stack.push(partial(self._save_on_failure, workers, boundary))
        located = record_location(cfg, self.run_dir, workers)
        if located is not None:
            self.record("cluster", **located)
        if prep.checkpoint is not None:
            self._restore(workers, weights, prep)
        tracking = self.tracking
        assert tracking is not None

        def on_phase(name: str) -> None:
            _abandon_if_late(preempt, boundary, times, name)
            boundary.phase(name)
            tracking.phase(name)

        version = prep.resumed.weight_version if prep.resumed is not None else 0

        def on_alarm(alarm: MismatchAlarm | NoSignalAlarm) -> None:  # trackers and `quartet inspect` see it
            self.record("alarm", **alarm.record())

        runner = StepRunner(cfg, workers, weights, prep.kl_ctrl, on_phase, version, on_alarm, roles.rollout)
        records = RolloutRecorder(cfg, prep.tokenizer, self.run_dir)
        source = stack.enter_context(open_batch_source(cfg, workers, reward, prep, roles.rollout))
        return _Session(prep, workers, reward, runner, source, records, boundary, result, preempt, times)

    def _open_tracking(self, stack: ExitStack, prep: Prepared, steps_done: int) -> None:
        """The trackers of `trainer.loggers` (a logger whose package is missing fails here, before any
        worker starts), and the records of what was prepared."""
        t = self.cfg.trainer
        self.tracking = stack.enter_context(
            Tracking(
                t.loggers,
                self.run_dir,
                t.project_name,
                t.experiment_name,
                to_dict(self.cfg),
                prep.total,
                steps_done,
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
            save_on_failure(boundary, exc, workers.host_sets, partial(self._save, workers))

    # ---- the loop ---------------------------------------------------------------------------------------

    def _train_step(self, s: _Session, step: int) -> None:
        s.times.step = step
        s.times.step_began = time.perf_counter()
        trained = s.runner.run(s.source, step)
        metrics = trained.metrics
        s.times.step_s = metrics["timing_s/step"]
        name_reward_failures(self.run_dir, s.reward, s.prep.data.train, step)
        metrics["training/epoch"] = float(s.prep.sampler.epoch)
        s.result.train_seconds += metrics["timing_s/step"]
        s.boundary.completed(  # the state of the finished step, before the next one draws prompts
            TrainerState(
                step,
                trained.sampler_state,
                s.prep.kl_ctrl.state_dict(),
                s.result.train_seconds,
                self.cfg.cluster.world_size,
                s.prep.model_path,
                weight_version=s.runner.weight_version,
                layout=actor_layout(self.cfg),
            )
        )
        s.records.train(trained.batch, step)
        self.record("step", step=step, **metrics)
        s.result.steps = step
        s.result.last_metrics = metrics
        if not self.startup.reported:  # the first step of this process: where the time before it went
            self.record("startup", step=step, **self.startup.report(metrics["timing_s/step"]))

    def _validate(self, s: _Session, step: int) -> None:
        assert s.prep.data.val is not None
        writer = s.records.val_writer(step)
        val = validate(self.cfg, s.workers, s.prep.data.val, s.reward, step, writer, s.runner.rollout)
        name_reward_failures(self.run_dir, s.reward, s.prep.data.val, step)
        s.result.validations.append(self.record("val", step=step, **val))

    def _save_completed(self, s: _Session) -> None:
        if s.boundary.last is not None:
            began = time.perf_counter()
            self._save(s.workers, s.boundary.last)
            s.times.save_s = time.perf_counter() - began
            s.boundary.saved_step = s.boundary.last.step
            s.preempt.saved_step = s.boundary.last.step

    def _preempted(self, s: _Session) -> None:
        """The preemption's checkpoint: the last completed step unless it is saved already; then one log
        line and the `preempt` record (the workers stop as the session closes)."""
        p, last = s.preempt, s.boundary.last
        began = time.perf_counter()
        waited = time.monotonic() - p.received_at if p.received_at is not None else 0.0
        saved_now = last is not None and last.step > s.boundary.saved_step
        if saved_now:
            assert last is not None
            p.saving_step = last.step
            self._save_completed(s)
        p.saved = True
        seconds = time.perf_counter() - began
        step = s.boundary.saved_step
        what = f"saved step {step} in {seconds:.2f} s" if saved_now else f"step {step} was saved already"
        if s.times.abandoned:
            what += f" ({s.times.abandoned} abandoned: it could not finish within the grace)"
        log.warning(
            "preemption: %s received %.2f s before the save; %s; exiting with %d (trainer.preempt_exit_code) "
            "once the workers stop; resume with trainer.resume=auto",
            p.signal_name,
            waited,
            what,
            p.exit_code,
        )
        self.record(
            "preempt",
            step=step,
            signal=p.signal_name,
            saved=saved_now,
            save_seconds=seconds,
            since_signal_s=waited + seconds,
            abandoned=s.times.abandoned,
            grace_s=p.grace_s,
            exit_code=p.exit_code,
        )
        s.result.preempted = p.notice()

    def _finish(self, s: _Session) -> None:
        """After the loop: measured memory next to the plan, and the final export."""
        if s.prep.planned.report is not None and s.result.steps > 0:
            self.record("memory", step=s.result.steps, **s.prep.planned.record(), **measured_peaks(s.workers))
        if self.cfg.trainer.export_final and s.result.steps == s.prep.total:
            export_policy(s.workers, self.run_dir / HF_DIR)
            s.result.hf_dir = self.run_dir / HF_DIR

    # ---- checkpoints ------------------------------------------------------------------------------------

    def _save(self, workers: Workers, state: TrainerState) -> Path:
        began = time.perf_counter()
        keep = self.cfg.trainer.max_checkpoints_to_keep
        hook = self.callbacks.after_roles_saved
        path = save_checkpoint(
            self.run_dir, state, to_yaml(self.cfg), partial(save_roles, workers), keep, hook
        )
        self.record("checkpoint", step=state.step, path=str(path), seconds=time.perf_counter() - began)
        return path

    def _restore(self, workers: Workers, weights: WeightSync, prep: Prepared) -> None:
        """Roles' state from the resumed checkpoint, then the rollout engine gets the restored actor's
        weights."""
        checkpoint, resumed = prep.checkpoint, prep.resumed
        assert checkpoint is not None and resumed is not None
        restore_roles(workers, weights, checkpoint, resumed.roles, resumed.weight_version)
        step, total = resumed.step, prep.total
        note = f"resumed from {checkpoint} at step {step} of {total}"
        change = world_change(resumed, self.cfg.cluster.world_size, actor_layout(self.cfg))
        if change is not None:
            note += f" ({change})"
        if prep.rejected:
            note += " (newer checkpoints that do not match their manifest: " + " | ".join(prep.rejected) + ")"
        if step >= total:
            note += (
                ": nothing left to train. Raise trainer.total_steps to go on, or set trainer.resume=off to "
                "start over"
            )
        self.record("resume", step=step, checkpoint=str(checkpoint), note=note, rejected=list(prep.rejected))


def _preemption(stack: ExitStack, cfg: QuartetConfig) -> Preemption:
    """The run's preemption handling, installed first (a signal during start-up stops the run before its
    first step) and closed last (after the workers stopped)."""
    preempt = Preemption(cfg.trainer.preempt_grace_s, cfg.trainer.preempt_exit_code)
    if preempt.install():
        stack.callback(preempt.close)
    return preempt


def _abandon_if_late(preempt: Preemption, boundary: StepBoundary, times: _Times, phase: str) -> None:
    """At a phase boundary after a preemption signal: abandon the step (raise `StepAbandoned`) when it
    cannot finish and be saved within the grace left and no update began, so the roles still hold the last
    completed step, which is saved instead."""
    if not preempt.requested or boundary.updating:
        return
    if not preempt.step_fits(time.perf_counter() - times.step_began, *times.estimate):
        raise StepAbandoned(f"step {times.step} at phase '{phase}'")


def _every(freq: int, step: int) -> bool:
    return bool(freq) and step % freq == 0
