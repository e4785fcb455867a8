"""The RL driver: data, workers, the loop over steps, validation, records.

    result = RLTrainer(cfg, on_record=print).run()

One run, in order:
1. resolve the model (build the tiny one when `model.path` is empty) and its tokenizer;
2. load train/val prompts (`data.train_files`/`val_files`, or the built-in task written into the run
   folder), reporting filtered/truncated/bad rows, and a seeded sampler over the training prompts;
3. start the workers (actor + rollout, and the reference/critic/reward model when needed) on one pool;
4. validate before training (`trainer.val_before_train`), then run `total_steps` steps (`StepRunner`),
   validating every `test_freq` steps and after the last;
5. shut every worker down, whatever happened.

Every record (data report, step metrics, validation) is appended to `<run dir>/metrics.jsonl` and handed to
`on_record`. The run's Ray names go to `<run dir>/cluster.json` for tools in other processes.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quartet.cluster.naming import RunNames
from quartet.config import QuartetConfig, to_yaml
from quartet.core.batch import Batch
from quartet.data.prompts import PromptDataset
from quartet.data.sampler import PromptSampler
from quartet.models.loading import load_tokenizer
from quartet.sft.trainer import resolve_model
from quartet.trainer.step import StepRunner, kl_controller
from quartet.trainer.validation import validate
from quartet.trainer.workers import start_workers

__all__ = ["RLData", "RLResult", "RLTrainer", "prepare_rl_data"]

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
        from quartet.data.tasks import ArithmeticSpec, write_builtin

        spec = None
        if cfg.data.builtin_task is BuiltinTask.ARITHMETIC:
            ops = tuple(op.symbol for op in cfg.data.builtin_operations)
            spec = ArithmeticSpec(digits=cfg.data.builtin_digits, operations=ops)
        train_path, val_path = write_builtin(
            cfg.data.builtin_task,
            run_dir / "data",
            cfg.data.builtin_train_size,
            cfg.data.builtin_val_size,
            cfg.data.seed,
            spec=spec,
        )
        train_files, val_files = [str(train_path)], val_files or [str(val_path)]
    train = PromptDataset.from_files(train_files, cfg.data, tokenizer)
    val = PromptDataset.from_files(val_files, cfg.data, tokenizer) if val_files else None
    return RLData(train, val)


class RLTrainer:
    """Runs PPO / GRPO / ... as the config says; see the module docstring."""

    def __init__(self, cfg: QuartetConfig, on_record: Callable[[Record], None] | None = None) -> None:
        self.cfg = cfg
        self.on_record = on_record
        self.run_dir = Path(cfg.trainer.output_dir) / cfg.trainer.experiment_name
        self.metrics_path = self.run_dir / "metrics.jsonl"

    def record(self, kind: str, **values: Any) -> Record:
        rec: Record = {"kind": kind, "time": time.time(), **values}
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.on_record is not None:
            self.on_record(rec)
        return rec

    def run(self) -> RLResult:
        cfg, start = self.cfg, time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        model_path = resolve_model(cfg)
        tokenizer = load_tokenizer(cfg.model.tokenizer_path or model_path)
        data = prepare_rl_data(cfg, tokenizer, self.run_dir)
        self.record(
            "data", train=data.train.report.as_dict(), val=data.val.report.as_dict() if data.val else None
        )
        sampler = PromptSampler(len(data.train), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed)
        total = cfg.trainer.total_steps or sampler.steps_per_epoch * cfg.trainer.total_epochs
        from quartet.rewards.compute import RewardComputer  # the scorer process pool starts here

        reward = RewardComputer(cfg.reward, tokenizer, cfg.data.max_response_length)
        names = RunNames.new(cfg.cluster.namespace, cfg.trainer.experiment_name)
        if cfg.cluster.run_prefix:
            names = RunNames(cfg.cluster.namespace, cfg.cluster.run_prefix)
        result = RLResult(self.run_dir)
        workers = None
        try:
            workers = start_workers(cfg, model_path, names, total)
            if cfg.cluster.backend == "ray":
                workers.hosts.names.save(self.run_dir)
            runner = StepRunner(cfg, workers, reward, kl_controller(cfg), data.train.pad_id)
            if data.val is not None and cfg.trainer.val_before_train:
                result.validations.append(
                    self.record("val", step=0, **validate(cfg, workers, data.val, reward, 0))
                )
            for step in range(1, total + 1):
                prompts = self._prompts(data.train, sampler.next_indices(), step)

                def more(k: int, step: int = step) -> Batch:  # dynamic sampling's extra draws
                    return self._prompts(data.train, sampler.next_indices(), step, draw=k)

                _, metrics = runner.run(prompts, step, more)
                metrics["training/epoch"] = float(sampler.epoch)
                result.train_seconds += metrics["timing_s/step"]
                self.record("step", step=step, **metrics)
                result.steps, result.last_metrics = step, metrics
                freq = cfg.trainer.test_freq
                if data.val is not None and ((freq and step % freq == 0) or step == total):
                    val = validate(cfg, workers, data.val, reward, step)
                    result.validations.append(self.record("val", step=step, **val))
            if cfg.trainer.export_final:
                workers.actor.export_hf(str(self.run_dir / "hf"))
                result.hf_dir = self.run_dir / "hf"
        finally:
            if workers is not None:
                workers.shutdown()
            reward.close()
        result.seconds = time.perf_counter() - start
        return result

    @staticmethod
    def _prompts(dataset: PromptDataset, indices: list[int], step: int, draw: int = 0) -> Batch:
        """The step's prompt batch with a fresh `uid` per prompt (the group id of its n responses)."""
        batch = dataset.batch(indices)
        uids = [f"s{step}-d{draw}-p{i}" for i in range(len(indices))]
        uids_batch = Batch({}, {"uid": uids}, batch_size=len(indices))
        return batch.union(uids_batch).with_meta(global_step=step)
