"""The SFT driver: data, workers, the loop over epochs, validation, export, and greedy exact match.

    result = SFTTrainer(cfg, on_record=print).run()

One run, in order:
1. resolve the model (build the tiny one when `model.path` is empty) and its tokenizer;
2. load the chat data (`sft.train_files`, or the built-in arithmetic set written into the run folder),
   counting malformed, filtered and truncated rows;
3. greedy exact match of the initial model on held-out conversations;
4. start the `SFTWorker` ranks (`cluster.backend`: Ray, or in this process) and take one optimizer step per
   global batch of `sft.batch_size` sequences, epoch after epoch, in a seeded shuffled order; validation
   loss after each epoch;
5. export a Hugging Face folder and evaluate it like the initial model.

Every record (data counts, steps, validation, evaluation) is appended to `<run dir>/metrics.jsonl` and
handed to `on_record`; the run ends with `<run dir>/summary.json`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from quartet.cluster.colocate import RoleSpec
from quartet.cluster.group import RoleGroup
from quartet.cluster.naming import RunNames
from quartet.cluster.run_record import mark_failed, mark_finished, mark_running, record_hosts
from quartet.cluster.runtime import launch
from quartet.config import QuartetConfig, to_yaml
from quartet.config.data import BuiltinTask
from quartet.models.tiny import resolve_model
from quartet.sft.data import LoadReport, SFTExample, collate, load_sft_files
from quartet.sft.evaluate import ExactMatch, Verifier, eval_samples, exact_text_match, greedy_exact_match
from quartet.sft.worker import SFTWorker
from quartet.tasks import TASKS, arithmetic, builtin_spec
from quartet.tracking.run_layout import CONFIG_FILE, DATA_DIR, HF_DIR, METRICS_FILE, SUMMARY_FILE

__all__ = ["EpochSampler", "SFTData", "SFTResult", "SFTTrainer", "prepare_data"]

log = logging.getLogger(__name__)
Record = dict[str, Any]


class EpochSampler:
    """Global batches of row indices: a seeded permutation per epoch, cut in order (the last may be short).

    The order of epoch e depends only on (seed, e), so a resumed run can find its place again.
    """

    def __init__(self, rows: int, batch_size: int, seed: int) -> None:
        if rows < 1 or batch_size < 1:
            raise ValueError(f"need rows >= 1 and batch_size >= 1, got {rows} and {batch_size}")
        self.rows = rows
        self.batch_size = batch_size
        self.seed = seed

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(self.rows / self.batch_size)

    def batches(self, epoch: int) -> list[list[int]]:
        """The batches of `epoch`; together they hold every row exactly once."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.rows, generator=generator).tolist()
        return [order[i : i + self.batch_size] for i in range(0, self.rows, self.batch_size)]


@dataclass
class SFTData:
    """Tokenized training and validation conversations, the loading counts, and the answer verifier."""

    train: list[SFTExample]
    val: list[SFTExample]
    reports: dict[str, LoadReport]
    verify: Verifier


@dataclass
class SFTResult:
    """What a run did and where it wrote it."""

    run_dir: Path
    hf_dir: Path
    steps: int = 0
    losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    before: ExactMatch | None = None
    after: ExactMatch | None = None
    seconds: float = 0.0
    train_seconds: float = 0.0
    """Time spent in optimizer steps (validation, evaluation and start-up excluded)."""

    def summary(self) -> Record:
        """Plain data for `summary.json` and the CLI."""
        return {
            "run_dir": str(self.run_dir),
            "hf_dir": str(self.hf_dir),
            "steps": self.steps,
            "loss_first": self.losses[0] if self.losses else None,
            "loss_last": self.losses[-1] if self.losses else None,
            "val_losses": self.val_losses,
            "accuracy_before": self.before.accuracy if self.before else None,
            "accuracy_after": self.after.accuracy if self.after else None,
            "eval_samples": self.after.total if self.after else 0,
            "seconds": round(self.seconds, 2),
        }


def prepare_data(cfg: QuartetConfig, tokenizer: Any, run_dir: Path) -> SFTData:
    """Load `sft.train_files` / `sft.val_files`, or write and load the built-in arithmetic set."""
    sft = cfg.sft
    if sft.train_files:
        train_files: list[Path] = [Path(f) for f in sft.train_files]
        val_files: list[Path] = [Path(f) for f in sft.val_files]
        verify: Verifier = exact_text_match
    else:
        b = sft.builtin
        if b.task is not BuiltinTask.ARITHMETIC:  # a multi-turn task's traces
            task = TASKS[b.task]
            folder = run_dir / DATA_DIR / b.task.value
            spec_t = builtin_spec(b.task, b.digits, b.sloppy)
            paths = task.write_sft_set(folder, spec_t, b.train_size, b.val_size, sft.seed)
            verify = task.verify_answer
        else:
            spec = arithmetic.ArithmeticSpec(b.digits, b.symbols, b.worked_answer)
            paths = arithmetic.write_sft_set(run_dir / DATA_DIR, spec, b.train_size, b.val_size, sft.seed)
            verify = arithmetic.verify_answer
        train_files, val_files = [paths[0]], [paths[1]]

    def load(files: list[Path], keep_verified: bool = False) -> tuple[list[SFTExample], LoadReport]:
        return load_sft_files(
            files,
            tokenizer,
            messages_key=sft.messages_key,
            tools_key=sft.tools_key,
            max_length=sft.max_length,
            truncate=sft.truncate,
            skip_bad_rows=sft.skip_bad_rows,
            keep_verified=keep_verified,
        )

    train, train_report = load(train_files, keep_verified=sft.keep_verified)
    if not train:
        raise ValueError(f"no usable training conversation in {train_files}: {train_report.summary()}")
    reports = {"train": train_report}
    val: list[SFTExample] = []
    if val_files:
        val, reports["val"] = load(val_files)
    return SFTData(train, val, reports, verify)


class SFTTrainer:
    """Supervised fine-tuning of `cfg.model` on `cfg.sft`'s data; `run()` does the whole run."""

    def __init__(self, cfg: QuartetConfig, on_record: Callable[[Record], None] | None = None) -> None:
        self.cfg = cfg
        self.sft = cfg.sft
        self.on_record = on_record
        self.run_dir = cfg.trainer.run_dir
        self.metrics_path = self.run_dir / METRICS_FILE

    def record(self, kind: str, **values: Any) -> None:
        """Append one record to metrics.jsonl and pass it on."""
        rec: Record = {"kind": kind, "time": round(time.time(), 3), **values}
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")
        if self.on_record is not None:
            self.on_record(rec)

    def run(self) -> SFTResult:
        from quartet.models.loading import load_tokenizer

        start = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path.write_text("")
        (self.run_dir / CONFIG_FILE).write_text(to_yaml(self.cfg))
        model_path = resolve_model(self.cfg)
        tokenizer = load_tokenizer(self.cfg.model.tokenizer_path or model_path)
        data = prepare_data(self.cfg, tokenizer, self.run_dir)
        for split, report in data.reports.items():
            self.record("data", split=split, **report.as_dict())
        result = SFTResult(self.run_dir, self.run_dir / HF_DIR)
        result.before = self.exact_match("before", model_path, tokenizer, data)
        sampler = EpochSampler(len(data.train), self.sft.batch_size, self.sft.seed)
        total = self.sft.epochs * sampler.batches_per_epoch
        total = min(total, self.sft.max_steps) if self.sft.max_steps else total
        cluster = self.cfg.cluster
        names = (
            RunNames(cluster.namespace, cluster.run_prefix)
            if cluster.run_prefix
            else RunNames.new(cluster.namespace, self.cfg.trainer.experiment_name)
        )
        mark_running(self.run_dir)
        hosts = None
        try:
            hosts = launch(
                self.cfg.cluster, names, "sft", sft=RoleSpec(SFTWorker, self.cfg, model_path, total)
            )
            if hosts.backend == "ray":  # names, and the node of each rank
                record_hosts(self.run_dir, hosts.names, [hosts])
            group: RoleGroup[SFTWorker] = hosts.groups["sft"]
            self.train(group, data, sampler, total, tokenizer.pad_token_id, result)
            group.export_hf(str(result.hf_dir))
        except BaseException as exc:
            mark_failed(self.run_dir, exc)
            raise
        finally:
            if hosts is not None:
                hosts.shutdown()
        mark_finished(self.run_dir)
        self.record("export", hf_dir=str(result.hf_dir))
        result.after = self.exact_match("after", str(result.hf_dir), tokenizer, data)
        result.seconds = time.perf_counter() - start
        (self.run_dir / SUMMARY_FILE).write_text(json.dumps(result.summary(), indent=2) + "\n")
        log.info("SFT done: %s", result.summary())
        return result

    def train(
        self,
        group: RoleGroup[SFTWorker],
        data: SFTData,
        sampler: EpochSampler,
        total_steps: int,
        pad_id: int,
        result: SFTResult,
    ) -> None:
        """Optimizer steps over epochs until `total_steps` (or `sft.max_seconds` of training); validation
        loss after each epoch."""
        limit, spent = self.sft.max_seconds, 0.0
        for epoch in range(self.sft.epochs):
            for rows in sampler.batches(epoch):
                if result.steps >= total_steps or (limit and spent >= limit):
                    total_steps = result.steps  # ends the epoch loop below too
                    break
                t0 = time.perf_counter()
                batch = collate([data.train[i] for i in rows], pad_id, group.dp_size)
                metrics = _rank_zero(group.train_batch(batch))
                result.steps += 1
                spent += time.perf_counter() - t0
                result.train_seconds = spent
                result.losses.append(metrics["loss"])
                self.record(
                    "train",
                    step=result.steps,
                    epoch=epoch,
                    loss=metrics["loss"],
                    lr=metrics["lr"],
                    grad_norm=metrics["grad_norm"],
                    tokens=int(metrics["tokens"]),
                    sequences=len(rows),
                    seconds=round(time.perf_counter() - t0, 4),
                )
            if data.val:
                val_loss, tokens = self.validation_loss(group, data.val, pad_id)
                result.val_losses.append(val_loss)
                self.record("val", step=result.steps, epoch=epoch, val_loss=val_loss, tokens=tokens)
            if result.steps >= total_steps:
                break

    def validation_loss(
        self, group: RoleGroup[SFTWorker], examples: list[SFTExample], pad_id: int
    ) -> tuple[float, int]:
        """Token-mean NLL of the assistant tokens of `examples` and their count."""
        nll, tokens = 0.0, 0.0
        for start in range(0, len(examples), self.sft.batch_size):
            batch = collate(examples[start : start + self.sft.batch_size], pad_id, group.dp_size)
            for part in _as_list(group.eval_loss(batch)):
                nll, tokens = nll + part["nll_sum"], tokens + part["tokens"]
        return nll / max(tokens, 1.0), int(tokens)

    def exact_match(self, phase: str, model_dir: str, tokenizer: Any, data: SFTData) -> ExactMatch | None:
        """Greedy exact match of the model in `model_dir` on the first `sft.eval_samples` validation rows."""
        samples = eval_samples(data.val, self.sft.eval_samples)
        if not samples:
            return None
        t0 = time.perf_counter()
        result = greedy_exact_match(
            model_dir, tokenizer, samples, data.verify, max_new_tokens=self.sft.eval_max_new_tokens
        )
        seconds = round(time.perf_counter() - t0, 2)
        self.record("eval", phase=phase, **result.as_dict(), examples=result.examples, seconds=seconds)
        return result


def _as_list(outputs: Any) -> list[dict[str, float]]:
    """A split call's non-Batch outputs: one per data-parallel rank, as a list."""
    return list(outputs) if isinstance(outputs, list) else [outputs]


def _rank_zero(outputs: Any) -> dict[str, float]:
    """Metrics of a train step: every rank reports the same global loss; rank 0's are kept."""
    return _as_list(outputs)[0]
