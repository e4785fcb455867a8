"""The parts of opening and closing an RL run that `RLTrainer` (`quartet.trainer.loop.rl_trainer`) strings
together.

    prep = prepare_run(cfg, run_dir, metrics_path)     # no process yet: plan, resume point, data, sampler
    roles = start_roles(stack, cfg, prep)              # the workers, the rollout's calls, the weight sync
    source = stack.enter_context(open_batch_source(cfg, roles.workers, reward, prep, roles.rollout))

Each opener enters what it starts into the run's `ExitStack`, so whatever fails later closes it, in reverse
order: the workers are shut down after the weight stream failed to open, the run folder says how the run
ended (`mark_run`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

from quartet.cluster.early_hosts import early_names
from quartet.cluster.naming import RunNames
from quartet.cluster.run_record import mark_failed, mark_finished, mark_running, record_hosts
from quartet.cluster.runtime import connection
from quartet.config import QuartetConfig, plan_step, to_yaml
from quartet.core.batch import Batch
from quartet.core.kl import KLController
from quartet.data.sampler import PromptSampler
from quartet.models.loading import load_tokenizer
from quartet.models.tiny import resolve_model
from quartet.models.tokenizer_match import check_same_tokenizer
from quartet.tracking.run_layout import CONFIG_FILE
from quartet.trainer.feed.batch_source import BatchSource, RolloutScorer, SyncGeneration
from quartet.trainer.feed.rl_data import RLData, image_inputs, prepare_rl_data, prompt_batch
from quartet.trainer.feed.rollout_feed import RolloutFeed
from quartet.trainer.feed.run_files import prepare_metrics_file
from quartet.trainer.loop.step import kl_controller
from quartet.trainer.records.memory import PlannedRun, plan_run
from quartet.trainer.recovery.checkpoint import TrainerState, choose_resume_checkpoint, load_trainer_state
from quartet.trainer.recovery.healing import heal_rollout
from quartet.trainer.workers.rollout_calls import RolloutCalls
from quartet.trainer.workers.start import Workers, start_workers
from quartet.trainer.workers.weight_sync import WeightSync, open_weight_sync

__all__ = [
    "Prepared",
    "actor_layout",
    "StartedRoles",
    "check_chat_template",
    "mark_run",
    "open_batch_source",
    "prepare_run",
    "record_location",
    "run_names",
    "start_roles",
]


@dataclass
class Prepared:
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
    rejected: tuple[str, ...] = ()
    """Newer checkpoints skipped because they do not match their manifest, each with its bad files."""

    @property
    def cfg(self) -> QuartetConfig:
        """The run's config, with the memory plan's proposal applied where `trainer.auto_fit` took it."""
        return self.planned.cfg


def prepare_run(cfg: QuartetConfig, run_dir: Path, metrics_path: Path, rules_score: bool = True) -> Prepared:
    """Everything that needs no process; a run that does not fit, a bad `trainer.resume` or bad data
    fails here, before any worker starts."""
    planned = plan_run(cfg)  # may apply the memory plan's proposal (trainer.auto_fit)
    cfg = planned.cfg
    run_dir.mkdir(parents=True, exist_ok=True)
    choice = choose_resume_checkpoint(cfg.trainer.resume, run_dir)
    checkpoint = choice.checkpoint
    world, layout = cfg.cluster.world_size, actor_layout(cfg)
    resumed = load_trainer_state(checkpoint, world, layout) if checkpoint else None
    prepare_metrics_file(metrics_path, resumed.step if resumed else None)
    (run_dir / CONFIG_FILE).write_text(to_yaml(cfg))
    model_path = resolve_model(cfg)
    tokenizer = load_tokenizer(cfg.model.tokenizer_path or model_path)
    if cfg.teacher.enabled:  # it scores the policy's token ids: they must mean the same text
        teacher = cfg.teacher.model_path or cfg.teacher.tokenizer_path  # a remote one: its tokenizer's folder
        check_same_tokenizer(cfg.model.tokenizer_path or model_path, teacher, "policy", "teacher")
    images = image_inputs(cfg, model_path, tokenizer)
    data = prepare_rl_data(cfg, tokenizer, run_dir, images, rules_score)
    if cfg.rollout.multi_turn.enable:
        check_chat_template(cfg, tokenizer, data, model_path)
    sampler = PromptSampler(len(data.train), cfg.data.train_batch_size, cfg.data.shuffle, cfg.data.seed)
    kl_ctrl = kl_controller(cfg)
    if resumed is not None:
        sampler.load_state_dict(resumed.sampler)
        kl_ctrl.load_state_dict(resumed.kl_ctrl)
    total = cfg.trainer.total_steps or sampler.steps_per_epoch * cfg.trainer.total_epochs
    rejected = tuple(v.describe() for v in choice.rejected)
    return Prepared(
        planned, checkpoint, resumed, model_path, tokenizer, data, sampler, kl_ctrl, total, rejected
    )


def actor_layout(cfg: QuartetConfig) -> dict[str, int]:
    """The actor's parallel sizes over `cluster.world_size` devices: dp, sp, tp, ep (a checkpoint records
    them, and a resume on another layout says what changed)."""
    m = cfg.model
    dp = cfg.cluster.world_size // (m.sequence_parallel_size * m.tensor_parallel_size)
    return {
        "dp": dp,
        "sp": m.sequence_parallel_size,
        "tp": m.tensor_parallel_size,
        "ep": m.expert_parallel_size,
    }


def check_chat_template(cfg: QuartetConfig, tokenizer: Any, data: RLData, model_path: str) -> None:
    """The chat-template check on the first training rows with the run's tools, before any worker starts:
    logged, and a refusal under `rollout.multi_turn.template_mode=strict` (quartet.agents.template_policy)."""
    from quartet.agents.runner import AgentRunner
    from quartet.agents.template_policy import PREFLIGHT_ROWS
    from quartet.environments.loop import check_environment_config

    check_environment_config(cfg.rollout.multi_turn)
    runner = AgentRunner.from_config(cfg.rollout.multi_turn, tokenizer, cfg.data.max_response_length)
    rows = [data.train.row(i)["raw_prompt"] for i in range(min(PREFLIGHT_ROWS, len(data.train)))]
    runner.preflight(rows, model_path)


def run_names(cfg: QuartetConfig) -> RunNames:
    """The Ray names of the run's workers: those its hosts were started under early
    (`quartet.cluster.early_hosts`), else `cluster.run_prefix`, or a fresh one from the experiment."""
    return early_names(cfg.cluster) or RunNames.for_run(
        cfg.cluster.namespace, cfg.cluster.run_prefix, cfg.trainer.experiment_name
    )


def mark_run(stack: ExitStack, run_dir: Path) -> None:
    """`run_state.json` says running now, and finished or failed (with the error) when `stack` closes."""
    mark_running(run_dir)
    stack.push(partial(_mark_end, run_dir))


def _mark_end(
    run_dir: Path, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
) -> None:
    if exc is None:
        mark_finished(run_dir)
    else:
        mark_failed(run_dir, exc)


@dataclass
class StartedRoles:
    """The run's workers, and how the loop reaches the rollout: its calls and the weight sync to it."""

    workers: Workers
    rollout: RolloutCalls
    """The calls on the rollout group: a healing view when recovery is on (`quartet.trainer.recovery`)."""
    weights: WeightSync
    """The weight sync, restarting a replica that died under it when recovery is on."""


def start_roles(stack: ExitStack, cfg: QuartetConfig, prep: Prepared) -> StartedRoles:
    """The run's workers (shut down when `stack` closes), the calls on their rollout group and the weight
    sync (a rollout replica that dies is restarted within both when recovery is on)."""
    workers = start_workers(cfg, plan_step(cfg), prep.model_path, run_names(cfg), prep.total)
    stack.callback(workers.shutdown)
    rollout, weights = heal_rollout(cfg, workers, open_weight_sync(cfg, workers))
    return StartedRoles(workers, rollout, weights)


def record_location(cfg: QuartetConfig, run_dir: Path, workers: Workers) -> dict[str, Any] | None:
    """Where the run is: names and each rank's node in cluster.json; the `cluster` record's values (which
    Ray it joined), None on the local backend."""
    if cfg.cluster.backend != "ray":
        return None
    record_hosts(run_dir, workers.hosts.names, workers.host_sets)
    return {"ray": connection(), "prefix": workers.hosts.names.prefix}


def open_batch_source(
    cfg: QuartetConfig, workers: Workers, reward: Any, prep: Prepared, rollout: RolloutCalls | None = None
) -> BatchSource:
    """The source of `trainer.mode`: sync generation, or the feed of one_step_off (depth 1, no staleness
    check: it is 1 by construction) or async (up to `async_buffer` ahead, `max_staleness` kept by admission
    control or by regenerating stale groups: `trainer.staleness_control`); `rollout`: the calls on the
    rollout group (the healing view with recovery on; None: the plain group of `workers`)."""
    scorer = RolloutScorer(cfg, workers.reward_model, reward)
    dataset = prep.data.train
    sampler = prep.sampler
    pad_id = prep.data.train.pad_id

    def draw(step: int, k: int) -> Batch:  # k > 0: dynamic sampling's extra draws
        return prompt_batch(dataset, sampler.next_indices(), step, draw=k)

    plan = workers.plan
    if not plan.generation_ahead:
        return SyncGeneration(cfg, workers, scorer, draw, sampler.state_dict, pad_id, rollout)
    return RolloutFeed(
        workers,
        scorer,
        draw,
        sampler.state_dict,
        depth=plan.batches_ahead,
        max_staleness=plan.max_staleness,
        last_step=prep.total,
        pad_id=pad_id,
        admission=plan.admission,
        rollout=rollout,
    )
