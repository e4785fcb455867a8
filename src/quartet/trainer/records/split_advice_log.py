"""The split advisor applied to a config: how the config expresses a split of the devices between the
rollout pool and the trainer's, the advice as overrides, and the run-log line after
`trainer.split_advice_after_steps` steps (`quartet.trainer.records.split_advice` holds the model).

What a split can be today:
- **CPU**: the CPUs per bundle of each pool, `cluster.pool_cpus.{main,rollout}` (default: both
  `cluster.cpus_per_bundle`, or with 0 an equal share of the node), in whole CPUs (torch threads).
- **Whole GPUs**: a separate pool has the main pool's shape (`cluster.nodes x bundles_per_node` each), so
  the split is 1:1 and cannot be changed; the advice says what the model would choose in devices, marked
  as not configurable, and the buffer.
- **One shared GPU** (`cluster.gpu_fraction` below 1): the fractions place the two processes on one
  device but do not divide its compute (the GPU time-slices between them), so there is no split to tune;
  the advice is the buffer only.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from quartet.config import QuartetConfig, plan_step
from quartet.config.cluster import MAIN_POOL, ClusterConfig, DeviceKind
from quartet.config.roles import Role
from quartet.trainer.records.callbacks import Record, RunCallbacks
from quartet.trainer.records.split_advice import SplitAdvice, StepTimes, advise, busy_times

__all__ = [
    "SplitAdviceLog",
    "SplitSpace",
    "advice_for",
    "advice_overrides",
    "plan_advice",
    "render_advice",
    "split_advice_callbacks",
    "split_space",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitSpace:
    """How a config splits the devices: each pool's share now, the step between splits (None: only the
    current split can be configured) and the unit the shares are counted in."""

    rollout_share: float
    trainer_share: float
    grain: float | None
    unit: str
    note: str = ""
    configurable: bool = True
    """Whether `advice_overrides` can express another split (only the buffer otherwise)."""


def split_space(cfg: QuartetConfig, device: str | None = None) -> SplitSpace | None:
    """The split `cfg` runs with (`device`: `cpu` or `gpu`, default `cluster.device`, `auto` read as CPU
    unless it names a GPU fraction); None when the rollout shares the actor's pool (nothing to split)."""
    c = cfg.cluster
    if Role.ROLLOUT not in c.separate_pools:
        return None
    kind = device or ("gpu" if c.device is DeviceKind.GPU or c.sharing_pools else "cpu")
    if kind == "gpu" and c.sharing_pools:
        note = "one shared GPU: cluster.gpu_fraction places the pools but does not divide the GPU's compute"
        share = c.gpu_fraction.of(Role.ROLLOUT), c.gpu_fraction.of(MAIN_POOL)
        return SplitSpace(share[0], share[1], None, "GPU fraction", note, configurable=False)
    if kind == "gpu":
        note = "not configurable yet: a separate pool has the main pool's shape, so the split stays 1:1"
        world = float(c.world_size)
        return SplitSpace(world, world, 1.0, "GPUs", note, configurable=False)
    auto = max(1.0, float((os.cpu_count() or 2) // (c.bundles_per_node * len(c.pools))))
    each = c.cpus_per_bundle or auto
    rollout, main = c.pool_cpus.of(Role.ROLLOUT) or each, c.pool_cpus.of(MAIN_POOL) or each
    return SplitSpace(rollout, main, 1.0, "CPUs per bundle", _oversubscribed(c, rollout + main))


def _oversubscribed(c: ClusterConfig, declared: float) -> str:
    """A warning when the pools of a local run declare more CPUs than this machine has: the advice's model
    (a pool's time goes as 1 / its CPUs) then fails, since an extra thread slows both pools instead
    (measured: docs/async.md, the split check)."""
    cores = os.cpu_count() or 1
    total = declared * c.bundles_per_node
    if c.address or total <= cores:
        return ""
    return (
        f"the pools declare {total:g} CPUs on this machine's {cores}: the advice assumes real CPUs and is "
        "unreliable here; keep cluster.pool_cpus within the cores"
    )


def _buffers(cfg: QuartetConfig) -> tuple[tuple[int, ...], int]:
    """The buffers to consider and the current depth: one_step_off is one batch ahead, fixed."""
    plan = plan_step(cfg)
    if not plan.tunable_depth:
        return (1,), 1
    depth = plan.batches_ahead
    if plan.admission and plan.max_staleness is not None:
        depth = max(1, min(depth, plan.max_staleness))
    return (1, 2, 3, 4), depth


def advice_for(
    cfg: QuartetConfig, generation_s: list[float], training_s: list[float], device: str | None = None
) -> tuple[SplitAdvice, SplitSpace] | None:
    """The advice for `cfg` from measured busy seconds per step of each pool; None without a separate
    rollout pool or without a step."""
    space = split_space(cfg, device)
    if space is None or not generation_s:
        return None
    times = StepTimes(tuple(generation_s), tuple(training_s), space.rollout_share, space.trainer_share)
    buffers, depth = _buffers(cfg)
    return advise(times, space.grain, current_buffer=depth, buffers=buffers), space


def advice_overrides(cfg: QuartetConfig, advice: SplitAdvice, space: SplitSpace) -> list[str]:
    """The overrides that apply the advice (the split where it can be configured, and the buffer)."""
    out = []
    b = advice.best
    if space.configurable and (b.rollout_share, b.trainer_share) != (
        space.rollout_share,
        space.trainer_share,
    ):
        out += [
            f"cluster.pool_cpus.main={b.trainer_share:g}",
            f"cluster.pool_cpus.rollout={b.rollout_share:g}",
        ]
    if plan_step(cfg).tunable_depth and b.async_buffer != advice.current.async_buffer:
        out.append(f"trainer.async_buffer={b.async_buffer}")
        if cfg.trainer.max_staleness < b.async_buffer:
            out.append(f"trainer.max_staleness={b.async_buffer}")  # admission caps the depth at the bound
    return out


def render_advice(cfg: QuartetConfig, advice: SplitAdvice, space: SplitSpace) -> str:
    """The advice line, its note and the overrides that apply it."""
    line = advice.render(space.unit, buffer=plan_step(cfg).tunable_depth)
    fix = advice_overrides(cfg, advice, space)
    note = f"; {space.note}" if space.note else ""
    return line + note + (f"; apply: {' '.join(fix)}" if fix else "; keep the current settings")


class SplitAdviceLog(RunCallbacks):
    """Logs the advice once, after `after_steps` steps of an overlapped run (the first step, which waits
    for a cold pipeline, is left out when there are more); keeps it in `self.line`."""

    def __init__(self, cfg: QuartetConfig, after_steps: int) -> None:
        self.cfg = cfg
        self.after_steps = after_steps
        self.steps: list[Record] = []
        self.line: str | None = None

    def on_record(self, record: Record) -> None:
        if record.get("kind") != "step" or self.line is not None:
            return
        self.steps.append(record)
        if len(self.steps) < self.after_steps:
            return
        from quartet.planning.estimate import resolve_device  # `auto`: whether torch sees a GPU

        gen, train = busy_times(self.steps[1:] if len(self.steps) > 1 else self.steps)
        found = advice_for(self.cfg, gen, train, resolve_device(self.cfg))
        if found is None:
            self.line = ""
            return
        self.line = render_advice(self.cfg, *found)
        # a warning, as the trainer's other notes: `quartet train` configures no logging, so INFO is not shown
        log.warning("after %d steps: %s", len(self.steps), self.line)


def split_advice_callbacks(cfg: QuartetConfig) -> list[RunCallbacks]:
    """The advice callback when `trainer.split_advice_after_steps` asks for it in an overlapped mode."""
    t = cfg.trainer
    if t.split_advice_after_steps <= 0 or not plan_step(cfg).generation_ahead:
        return []
    return [SplitAdviceLog(cfg, t.split_advice_after_steps)]


def plan_advice(cfg: QuartetConfig, device: str, step_times: str | None) -> str | None:
    """What `quartet plan` prints for an overlapped config: the advice from `step_times` ("GEN,TRAIN":
    busy seconds per step of the rollout pool and of the trainer's at the config's split, e.g. read off a
    short run's `timing_s/*_idle`), or how to get them (the memory planner estimates no speeds). None for
    a sync or colocated config."""
    if not plan_step(cfg).generation_ahead or split_space(cfg, device) is None:
        return None
    if not step_times:
        return (
            "split advice: needs measured step times (the planner estimates memory, not speed): run a few "
            f"steps (the run log prints it after trainer.split_advice_after_steps="
            f"{cfg.trainer.split_advice_after_steps}), or pass --step-times GEN,TRAIN (each pool's busy "
            "seconds per step at this split)"
        )
    try:
        gen, train = (float(x) for x in step_times.split(","))
    except ValueError:
        raise ValueError(
            f"--step-times: expected GEN,TRAIN in seconds, e.g. 1.2,0.8; got {step_times!r}"
        ) from None
    found = advice_for(cfg, [gen], [train], device)
    return None if found is None else render_advice(cfg, *found)
