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
(`quartet.tracking`; `<run dir>/metrics.jsonl` always) and is handed to `on_record`. The run's Ray names
go to `<run dir>/cluster.json` for tools in other processes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from quartet.cluster.naming import RunNames
from quartet.cluster.run_record import mark_failed, mark_finished, mark_running, record_hosts
from quartet.cluster.runtime import connection
from quartet.config import QuartetConfig, plan_step, to_dict, to_yaml
from quartet.core.batch import Batch
from quartet.data.bad_rows import BAD_ROWS_FILE, BadRow, append_bad_rows, replace_load_rows
from quartet.data.prompts import PromptDataset
from quartet.data.sampler import PromptSampler
from quartet.models.loading import load_tokenizer
from quartet.models.resolve import resolve_model
from quartet.tracking import Tracking
from quartet.tracking.jsonl_sink import drop_torn_tail, read_records
from quartet.trainer.checkpoint import (
    CheckpointError,
    TrainerState,
    find_resume_checkpoint,
    load_trainer_state,
    save_checkpoint,
)
from quartet.trainer.failure_save import StepBoundary, save_on_failure
from quartet.trainer.memory import measured_peaks, plan_run
from quartet.trainer.rollout_records import rollout_rows, write_rollout_records
from quartet.trainer.step import StepRunner, kl_controller
from quartet.trainer.validation import validate
from quartet.trainer.workers import Workers, start_workers

__all__ = ["RLData", "RLResult", "RLTrainer", "RolloutRecorder", "prepare_rl_data"]

log = logging.getLogger(__name__)
Record = dict[str, Any]


@dataclass
class RLData:
    """The run's prompts: training set, validation set (may be None) and where they came from."""

    train: PromptDataset
    val: PromptDataset | None


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


def prepare_rl_data(cfg: QuartetConfig, tokenizer: Any, run_dir: Path) -> RLData:
    """Train/val prompt datasets from the configured files, or the built-in task written to `run_dir/data`."""
    train_files, val_files = list(cfg.data.train_files), list(cfg.data.val_files)
    if not train_files:
        from quartet.config.data import BuiltinTask
        from quartet.data.tasks import ArithmeticSpec, CalculatorSpec, write_builtin

        spec: Any = None
        if cfg.data.builtin_task is BuiltinTask.ARITHMETIC:
            ops = tuple(op.symbol for op in cfg.data.builtin_operations)
            spec = ArithmeticSpec(digits=cfg.data.builtin_digits, operations=ops)
        elif cfg.data.builtin_task is BuiltinTask.CALCULATOR:
            spec = CalculatorSpec(digits=cfg.data.builtin_digits)
        train_path, val_path = write_builtin(
            cfg.data.builtin_task,
            run_dir / "data",
            cfg.data.builtin_train_size,
            cfg.data.builtin_val_size,
            cfg.data.seed,
            spec=spec,
        )
        train_files, val_files = [str(train_path)], val_files or [str(val_path)]
    tools, check = _tool_schemas(cfg), source_checker(cfg)
    train = PromptDataset.from_files(train_files, cfg.data, tokenizer, tools, check)
    val = PromptDataset.from_files(val_files, cfg.data, tokenizer, tools, check) if val_files else None
    return RLData(train, val)


def source_checker(cfg: QuartetConfig) -> Callable[[str], None] | None:
    """When the built-in rules score (no `reward.function`, no reward model), a check that a data source
    has a rule scorer, raising `RowProblem`: run on every row at load, so a row no rule knows is refused
    (or skipped) there, naming its file and row, instead of crashing the run when it is first drawn."""
    if cfg.reward.function or cfg.reward.model_path:
        return None
    from quartet.data.errors import RowProblem
    from quartet.rewards.rules.registry import UnknownDataSourceError, known_data_sources, select_scorer

    key = cfg.data.data_source_key

    def check(data_source: str) -> None:
        try:
            select_scorer(data_source)
        except UnknownDataSourceError:
            raise RowProblem(
                "unknown_data_source",
                key,
                f"no rule scorer for data_source {data_source!r}; known data sources: {known_data_sources()}",
                "correct the row's data_source, or set reward.function=path/to/file.py:function_name (a "
                "compute_score(data_source, solution_str, ground_truth, extra_info) that scores it)",
            ) from None

    return check


def _tool_schemas(cfg: QuartetConfig) -> list[dict[str, Any]] | None:
    """The schemas the agent loops render into prompts (multi-turn runs), so prompt lengths are measured as
    the model sees them; loading the tools here also reports a bad tools file before any worker starts."""
    if not cfg.rollout.multi_turn.enable:
        return None
    from quartet.agents.runner import build_tools

    return [tool.schema for tool in build_tools(cfg.rollout.multi_turn).values()] or None


class RLTrainer:
    """Runs PPO / GRPO / ... as the config says; see the module docstring.

    `stop_after`: leave the loop (with a checkpoint) after this many steps of this process, as a job with
    a time slice would; `trainer.resume=auto` continues from there. `after_roles_saved` is a test hook
    called inside each checkpoint write (see `quartet.trainer.checkpoint.save_checkpoint`).
    """

    def __init__(
        self,
        cfg: QuartetConfig,
        on_record: Callable[[Record], None] | None = None,
        stop_after: int | None = None,
        after_roles_saved: Callable[[Path], None] | None = None,
        console: Any = None,
    ) -> None:
        self.cfg = cfg
        self.console = console  # a rich Console for the console logger (None: its own)
        self.tracking: Tracking | None = None
        self.on_record = on_record
        self.stop_after = stop_after
        self.after_roles_saved = after_roles_saved
        self.run_dir = cfg.trainer.run_dir
        self.metrics_path = self.run_dir / "metrics.jsonl"

    def record(self, kind: str, **values: Any) -> Record:
        """Log a record to every tracker (metrics.jsonl first) and hand it to `on_record`."""
        assert self.tracking is not None, "records are logged while the run is running"
        rec: Record = self.tracking.log({"kind": kind, **values})
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def run(self) -> RLResult:
        start = time.perf_counter()
        planned = plan_run(self.cfg)  # a run that does not fit stops here (or is fitted: trainer.auto_fit)
        cfg = self.cfg = planned.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # a bad trainer.resume or an incompatible checkpoint fails here, before any worker starts
        checkpoint = find_resume_checkpoint(cfg.trainer.resume, self.run_dir)
        state = load_trainer_state(checkpoint, cfg.cluster.world_size) if checkpoint else None
        self._prepare_records(state.step if state else None)
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        model_path = resolve_model(cfg)
        tokenizer = load_tokenizer(cfg.model.tokenizer_path or model_path)
        data = prepare_rl_data(cfg, tokenizer, self.run_dir)
        sampler = PromptSampler(len(data.train), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed)
        kl_ctrl = kl_controller(cfg)
        total = cfg.trainer.total_steps or sampler.steps_per_epoch * cfg.trainer.total_epochs
        result = RLResult(self.run_dir)
        if state is not None:
            sampler.load_state_dict(state.sampler)
            kl_ctrl.load_state_dict(state.kl_ctrl)
            result.steps, result.train_seconds = state.step, state.train_seconds
        t = cfg.trainer  # a logger whose package is missing fails here, before any worker starts
        self.tracking = Tracking(
            t.loggers,
            self.run_dir,
            t.project_name,
            t.experiment_name,
            to_dict(cfg),
            total,
            result.steps,
            self.console,
        )
        self.record(
            "data",
            train=data.train.report.as_dict(),
            val=data.val.report.as_dict() if data.val else None,
            bad_rows_file=self._name_bad_rows(data),
        )
        self.record("memory_plan", **planned.record())
        from quartet.rewards.compute import RewardComputer  # the scorer process pool starts here

        reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
        names = RunNames.new(cfg.cluster.namespace, cfg.trainer.experiment_name)
        if cfg.cluster.run_prefix:
            names = RunNames(cfg.cluster.namespace, cfg.cluster.run_prefix)
        workers = None
        boundary = StepBoundary(saved_step=result.steps)  # what a caught failure may still checkpoint
        mark_running(self.run_dir)
        try:
            workers = start_workers(cfg, plan_step(cfg), model_path, names, total)
            if cfg.cluster.backend == "ray":  # names, and the node of each rank
                record_hosts(self.run_dir, workers.hosts.names, [workers.hosts, *workers.separate.values()])
                self.record("cluster", ray=connection(), prefix=workers.hosts.names.prefix)
            if checkpoint is not None:
                self._restore(workers, checkpoint)
                note = f"resumed from {checkpoint} at step {result.steps} of {total}"
                if result.steps >= total:
                    note += (
                        ": nothing left to train. Raise trainer.total_steps to go on, or set "
                        "trainer.resume=off to start over"
                    )
                    log.warning(note)
                self.record("resume", step=result.steps, checkpoint=str(checkpoint), note=note)
            tracking = self.tracking

            def on_phase(name: str) -> None:
                boundary.phase(name)
                tracking.phase(name)

            runner = StepRunner(cfg, workers, reward, kl_ctrl, data.train.pad_id, on_phase)
            records = RolloutRecorder(cfg, tokenizer, self.run_dir)
            if data.val is not None and cfg.trainer.val_before_train and state is None:
                val = validate(cfg, workers, data.val, reward, 0, records.val_writer(0))
                self._name_reward_failures(reward, data.val, 0)
                result.validations.append(self.record("val", step=0, **val))
            first = result.steps + 1
            for step in range(first, total + 1):
                prompts = self._prompts(data.train, sampler.next_indices(), step)

                def more(k: int, step: int = step) -> Batch:  # dynamic sampling's extra draws
                    return self._prompts(data.train, sampler.next_indices(), step, draw=k)

                batch, metrics = runner.run(prompts, step, more)
                self._name_reward_failures(reward, data.train, step)
                metrics["training/epoch"] = float(sampler.epoch)
                result.train_seconds += metrics["timing_s/step"]
                boundary.completed(  # the state of the finished step, before the next one draws prompts
                    TrainerState(
                        step,
                        sampler.state_dict(),
                        kl_ctrl.state_dict(),
                        result.train_seconds,
                        cfg.cluster.world_size,
                        model_path,
                    )
                )
                records.train(batch, step)
                self.record("step", step=step, **metrics)
                result.steps, result.last_metrics = step, metrics
                freq = cfg.trainer.test_freq
                if data.val is not None and ((freq and step % freq == 0) or step == total):
                    val = validate(cfg, workers, data.val, reward, step, records.val_writer(step))
                    self._name_reward_failures(reward, data.val, step)
                    result.validations.append(self.record("val", step=step, **val))
                stopping = self.stop_after is not None and step - first + 1 >= self.stop_after
                save_freq = cfg.trainer.save_freq
                if ((save_freq and step % save_freq == 0) or step == total or stopping) and boundary.last:
                    self._save(workers, boundary.last)
                    boundary.saved_step = step
                if stopping:
                    break
            if planned.report is not None and result.steps > 0:  # the plan next to what the ranks used
                self.record("memory", step=result.steps, **planned.record(), **measured_peaks(workers))
            if cfg.trainer.export_final and result.steps == total:
                workers.actor.export_hf(str(self.run_dir / "hf"))
                result.hf_dir = self.run_dir / "hf"
        except BaseException as exc:
            if workers is not None:  # the last completed step, when every rank still answers
                save_on_failure(
                    boundary, exc, [workers.hosts, *workers.separate.values()], partial(self._save, workers)
                )
            mark_failed(self.run_dir, exc)
            self.tracking.__exit__(type(exc), exc, exc.__traceback__)  # trackers mark the run failed
            raise
        finally:
            if workers is not None:
                workers.shutdown()
            reward.close()
        self.tracking.close()
        mark_finished(self.run_dir)
        result.seconds = time.perf_counter() - start
        return result

    def _name_bad_rows(self, data: RLData) -> str | None:
        """Every skipped, over-long or cut row of the data sets into `bad_rows.jsonl`; its path (None when
        no row was), and one warning line with the counts."""
        bad = data.train.report.bad + (data.val.report.bad if data.val else [])
        path = self.run_dir / BAD_ROWS_FILE
        replace_load_rows(path, bad)
        if not bad:
            return None
        counts: dict[str, int] = {}
        for row in bad:
            counts[row.reason] = counts.get(row.reason, 0) + 1
        log.warning("%d rows skipped, dropped or cut at load %s: each is named in %s", len(bad), counts, path)
        return str(path)

    def _name_reward_failures(self, reward: Any, dataset: PromptDataset, step: int) -> None:
        """The responses whose score call failed (scored 0) since the last look, by dataset row, appended
        to `bad_rows.jsonl`, with one warning naming the rows and the file."""
        failures = reward.take_failures()
        if not failures:
            return
        bad = []
        for f in failures:
            src = dataset.source(f.row) if f.row is not None and 0 <= f.row < len(dataset) else None
            file, row, line = (src.file, src.row, src.line) if src else ("(unknown)", None, None)
            bad.append(BadRow("reward", file, row, "reward", f.status, f.reason, line=line, step=step))
        path = self.run_dir / BAD_ROWS_FILE
        append_bad_rows(path, bad)
        where = sorted({f"{Path(b.file).name}:{b.row}" for b in bad})
        log.warning(
            "step %d: %d responses scored 0 because their score call failed (rows %s%s; first: %s); "
            "each is named in %s",
            step,
            len(bad),
            ", ".join(where[:10]),
            ", ..." if len(where) > 10 else "",
            bad[0].message,
            path,
        )

    def _save(self, workers: Workers, state: TrainerState) -> Path:
        def save_roles(folder: Path) -> list[str]:
            workers.actor.save(str(folder / "actor"))
            if workers.critic is not None:
                workers.critic.save(str(folder / "critic"))
                return ["actor", "critic"]
            return ["actor"]

        began = time.perf_counter()
        path = save_checkpoint(
            self.run_dir,
            state,
            to_yaml(self.cfg),
            save_roles,
            self.cfg.trainer.max_checkpoints_to_keep,
            self.after_roles_saved,
        )
        self.record("checkpoint", step=state.step, path=str(path), seconds=time.perf_counter() - began)
        return path

    def _restore(self, workers: Workers, checkpoint: Path) -> None:
        """Roles' state from `checkpoint`, then the rollout engine gets the restored actor's weights."""
        state = load_trainer_state(checkpoint, self.cfg.cluster.world_size)
        has_critic = workers.critic is not None
        if ("critic" in state.roles) != has_critic:
            raise CheckpointError(
                f"{checkpoint} has roles {state.roles}, but this run {'has' if has_critic else 'has no'} "
                "critic (algorithm.adv_estimator changed?). Fix: resume with the checkpoint's algorithm, or "
                "trainer.resume=off"
            )
        workers.actor.load(str(checkpoint / "actor"))
        if workers.critic is not None:
            workers.critic.load(str(checkpoint / "critic"))
        workers.rollout.sync_weights()

    def _prepare_records(self, resumed_step: int | None) -> None:
        """metrics.jsonl for this process: on resume, records past the checkpoint's step (written after it by
        the interrupted run, and about to be redone) move to metrics.superseded.jsonl; on a fresh start an
        old file is renamed aside. Nothing is deleted."""
        if not self.metrics_path.exists():
            return
        if resumed_step is None:
            aside = self.metrics_path.with_name(f"metrics.{int(time.time())}.jsonl")
            self.metrics_path.rename(aside)
            log.warning("a fresh start: the earlier %s was renamed %s", self.metrics_path.name, aside.name)
            return
        drop_torn_tail(self.metrics_path)  # a write cut short by a crash: dropped with a warning
        keep, superseded = [], []
        for rec in read_records(self.metrics_path):  # any other bad line: an error naming file and line
            later = rec.get("kind") in ("step", "val", "checkpoint") and rec.get("step", 0) > resumed_step
            (superseded if later else keep).append(json.dumps(rec))
        if superseded:
            with self.metrics_path.with_name("metrics.superseded.jsonl").open("a") as f:
                f.write("\n".join(superseded) + "\n")
        self.metrics_path.write_text("".join(line + "\n" for line in keep))

    @staticmethod
    def _prompts(dataset: PromptDataset, indices: list[int], step: int, draw: int = 0) -> Batch:
        """The step's prompt batch with a fresh `uid` per prompt (the group id of its n responses)."""
        batch = dataset.batch(indices)
        uids = [f"s{step}-d{draw}-p{i}" for i in range(len(indices))]
        uids_batch = Batch({}, {"uid": uids}, batch_size=len(indices))
        return batch.union(uids_batch).with_meta(global_step=step)


class RolloutRecorder:
    """Writes rollout records (`quartet.trainer.rollout_records`) as `trainer.rollout_freq` says."""

    def __init__(self, cfg: QuartetConfig, tokenizer: Any, run_dir: Path) -> None:
        self.freq, self.limit = cfg.trainer.rollout_freq, cfg.trainer.rollout_samples
        self.tokenizer, self.folder = tokenizer, run_dir / "rollouts"

    def train(self, batch: Batch, step: int) -> None:
        if self.freq and step % self.freq == 0:
            rows = rollout_rows(batch, self.tokenizer, step, self.limit)
            write_rollout_records(self.folder / f"step_{step}.jsonl", rows)

    def val_writer(self, step: int) -> Callable[[Batch], None] | None:
        if not self.freq:
            return None

        def write(batch: Batch) -> None:
            rows = rollout_rows(batch, self.tokenizer, step)
            write_rollout_records(self.folder / f"val_step_{step}.jsonl", rows)

        return write
