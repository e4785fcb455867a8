"""Does a run fit its device, and what is the cheapest change that makes it fit: `fit_config(cfg)`.

Capacity is what the device has free now (`planning.capacity`). A plan fits when its peaks stay under
`HEADROOM` of that (allocator fragmentation, the CUDA context, Python objects the planner does not count).

When it does not fit, candidate changes are tried in order of expected slowdown, cheapest first (the
figures are rough, from what each change costs per step: extra host<->device copies, more kernel launches,
recomputation):

    GPU only:  reference.param_offload        its weights cross PCIe once per step       ~2%
               actor/critic.optimizer_offload  AdamW states cross twice per update       ~5%
    both:      model.expert_parallel_size up   two all-to-alls per MoE layer instead of  ~0-10% of update
                                               all-gathering every expert (an MoE model)
               rollout.max_num_seqs halved     fewer sequences in flight while sampling  ~5-10% of gen
               log-prob micro-batches halved   more, smaller forward passes              ~5%
               update micro-batches halved     more, smaller forward/backward passes     ~5-10%
               model.sequence_parallel_size x2 two all-to-alls per attention layer       ~5-15% of update
               model.gradient_checkpointing    one more forward per micro-batch          ~25-30% of update
               model.tensor_parallel_size x2   all-reduces in every layer                ~10-30% of update
    GPU only:  actor/critic.param_offload      weights cross PCIe around every phase     ~30%+

Each change is kept only when it lowers the planned peak and the config still validates (micro-batches
must divide mini-batches); halvings repeat down to one row (or one sequence of tokens) before the next
kind of change is tried. `trainer.auto_fit` applies the proposal before the workers start.

Sequence and tensor parallelism use the devices the run already has (`cluster.world_size`), so they are
offered only where the pool has room for the larger group (sp x tp must divide the world; sp the attention
heads; tp the attention and key/value heads and the vocabulary), and only for the memory they divide:
sequence parallelism (with `model.remove_padding`, which it needs) when the rows are long, i.e. the
activations and logits make up most of the policy's largest row (`activation_share`); tensor parallelism
when the parameter-sized parts do (weights, gradients, AdamW states, their half-precision casts, the
all-gathered layers). With a single device neither applies and the verdict asks for more devices. Neither
is offered for a mixture-of-experts model, which the engines refuse them for (`config.parallel.moe_problems`).

Expert parallelism (`_grow_ep`) is offered for a mixture-of-experts policy whose routed experts are at least
half of its parameters: the next size that `config.parallel`'s rules accept (it divides the experts per layer
and the world; no tensor parallelism nor LoRA with it). A rank then all-gathers E / ep experts of a layer
instead of all E, at the cost of two all-to-alls per MoE layer (measured faster than plain FSDP2 on CPU,
docs/moe_expert_parallel.md); its line says how much it frees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from quartet.config.errors import ConfigError
from quartet.config.loader import apply_overrides
from quartet.config.moe_shapes import shape_problems
from quartet.config.parallel import expert_problems, layout_problems, moe_problems, pool_problems
from quartet.config.plan import plan_step
from quartet.config.root import QuartetConfig
from quartet.config.validate import validate
from quartet.planning.capacity import Capacity, NoCudaDeviceError, detect_capacity, host_available_bytes
from quartet.planning.estimate import estimate_memory, resolve_device
from quartet.planning.experts import expert_params
from quartet.planning.model_shape import VISION_MODEL_TYPES
from quartet.planning.parallel import POLICY_ROLES
from quartet.planning.plan import MemoryPlan, PlanRow, format_bytes
from quartet.planning.role_shapes import RoleShapes, resolve_shapes

__all__ = [
    "ACTIVATION_PARTS",
    "DOMINANT_SHARE",
    "HEADROOM",
    "STATE_PARTS",
    "Capacity",
    "Change",
    "FitReport",
    "NoCudaDeviceError",
    "activation_share",
    "detect_capacity",
    "fit_config",
    "host_available_bytes",
]

HEADROOM = 0.9
"""Fraction of the free memory a plan may use."""

ACTIVATION_PARTS = frozenset({"activations", "logits", "fused_head"})
"""Plan components that grow with a micro-batch's tokens (what sequence parallelism divides)."""

STATE_PARTS = frozenset(
    {"weights", "optimizer", "grads", "freed_grads", "autocast_weights", "fsdp_gather", "optimizer_step"}
)
"""Plan components that grow with the parameters (what tensor parallelism divides, beyond FSDP2)."""

LITTLE_ROOM = 0.9
"""A plan that fits leaves little room when its peak is above this share of what it may use (`HEADROOM` of
the free memory): then an expert-parallel size that lowers it is shown as a hint."""

DOMINANT_SHARE = 0.5
"""A kind of memory dominates a row when it is at least this share of it."""


@dataclass(frozen=True)
class Change:
    """One config change of a proposal: dotted overrides and why."""

    overrides: tuple[str, ...]
    reason: str
    peak_after: int
    """The planned peak (device; combined on CPU) once this change and those before it are applied."""
    freed: int | None = None
    """What this change lowers the peak by, for the changes whose line says it (expert parallelism)."""


@dataclass(frozen=True)
class FitReport:
    """The plan of a config against a capacity, and the proposal when it does not fit."""

    plan: MemoryPlan
    capacity: Capacity
    changes: tuple[Change, ...] = ()
    fitted: QuartetConfig | None = None
    """The config with every change applied (None when no change was needed or none helped)."""
    fitted_plan: MemoryPlan | None = None
    hint: Change | None = None
    """A change worth knowing about though the plan fits: expert parallelism when the plan leaves little
    room (`LITTLE_ROOM`); not part of the proposal, not applied by `trainer.auto_fit`."""

    @property
    def fits(self) -> bool:
        return _fits(self.plan, self.capacity)

    @property
    def fits_after(self) -> bool:
        """Whether the proposal (or the config itself, with no proposal) fits."""
        return _fits(self.fitted_plan or self.plan, self.capacity)

    @property
    def overrides(self) -> list[str]:
        """Every override of the proposal, in order (what `trainer.auto_fit` applies)."""
        return [o for c in self.changes for o in c.overrides]

    def render(self) -> str:
        """The verdict and the proposal in words."""
        cap = self.capacity
        free = format_bytes(cap.device_bytes)
        limit = f"{format_bytes(HEADROOM * cap.device_bytes)} ({HEADROOM:.0%} of {free} free, {cap.source})"
        lines = [
            f"fits: {'yes' if self.fits else 'NO'}: peak {format_bytes(self.plan.peak_device)} vs {limit}"
        ]
        if not self.plan.unified:
            lines.append(
                f"host: peak {format_bytes(self.plan.peak_host)} vs {format_bytes(HEADROOM * cap.host_bytes)}"
            )
        if self.changes:
            lines.append("proposal, cheapest first (set trainer.auto_fit=true to apply it):")
            lines += [
                f"  {' '.join(c.overrides):<60} {c.reason}; "
                + ("" if c.freed is None else f"frees {format_bytes(c.freed)}, ")
                + f"peak {format_bytes(c.peak_after)}"
                for c in self.changes
            ]
            verdict = (
                "fits"
                if self.fits_after
                else "still does NOT fit: a smaller model, shorter sequences or more devices"
            )
            lines.append(f"with the proposal: {verdict}")
        elif self.hint is not None:
            h = self.hint
            lines.append(
                f"little room: {' '.join(h.overrides)} would free {format_bytes(h.freed or 0)} "
                f"(peak {format_bytes(h.peak_after)}; {h.reason})"
            )
        elif not self.fits:
            lines.append(
                "no config change found that fits: use a smaller model, shorter data.max_*_length, a smaller "
                "data.train_batch_size or rollout.n, or more devices"
            )
        return "\n".join(lines)


def _fits(plan: MemoryPlan, cap: Capacity) -> bool:
    return plan.peak_device <= HEADROOM * cap.device_bytes and plan.peak_host <= HEADROOM * cap.host_bytes


def _pressure(plan: MemoryPlan, cap: Capacity) -> tuple[float, int]:
    """What a change must lower: the larger of the device and host peaks as a fraction of what is free;
    then the sum of the phases at the device peak, so that shrinking one of two equally large phases counts
    (the other is shrunk next round) while shrinking a phase below the peak does not."""
    peak = plan.peak_device
    at_peak = sum(t for t in (plan.phase_device(p) for p in plan.phases) if t >= 0.99 * peak)
    return max(peak / max(cap.device_bytes, 1), plan.peak_host / max(cap.host_bytes, 1)), at_peak


def _halve(value: int, floor: int) -> int:
    return max(floor, value // 2)


_Change = Callable[[QuartetConfig], list[str]]
"""A config change: the overrides it makes to the current config, or [] when it has nothing left to give."""


def _switch(key: str, on: Callable[[QuartetConfig], bool]) -> _Change:
    """Turn the boolean `key` on (once)."""
    return lambda c: [] if on(c) else [f"{key}=true"]


def _halve_micro(role: str, section: str) -> _Change:
    """Halve a role's micro-batch (`section`: its logprobs/values pass; "": its update), in tokens when it
    batches dynamically (down to one full-length row), else in rows (down to one)."""

    def change(c: QuartetConfig) -> list[str]:
        m = getattr(getattr(c, role), section) if section else getattr(c, role)
        prefix = f"{role}.{section}." if section else f"{role}."
        if m.use_dynamic_batch:
            seq = c.data.max_prompt_length + c.data.max_response_length
            new = _halve(m.max_tokens_per_micro_batch, seq)
            return (
                [] if new == m.max_tokens_per_micro_batch else [f"{prefix}max_tokens_per_micro_batch={new}"]
            )
        new = _halve(m.micro_batch_size_per_device, 1)
        return [] if new == m.micro_batch_size_per_device else [f"{prefix}micro_batch_size_per_device={new}"]

    return change


def _halve_seqs(c: QuartetConfig) -> list[str]:
    new = _halve(c.rollout.max_num_seqs, c.rollout.n)  # at least one prompt's n samples in flight
    return [] if new == c.rollout.max_num_seqs else [f"rollout.max_num_seqs={new}"]


def _policy_peak_row(plan: MemoryPlan) -> PlanRow | None:
    """The policy engines' (actor, reference) largest row: where sequence and tensor parallelism act."""
    rows = [r for r in plan.rows if r.role in POLICY_ROLES]
    return max(rows, key=lambda r: r.total_bytes, default=None)


def activation_share(plan: MemoryPlan, parts: frozenset[str] = ACTIVATION_PARTS) -> float:
    """The share of `parts` (default: activations and logits) in the policy's largest row (0 without one)."""
    row = _policy_peak_row(plan)
    if row is None or row.total_bytes == 0:
        return 0.0
    return sum(v for k, v in row.breakdown.items() if k.removeprefix("host.") in parts) / row.total_bytes


def _grow_sp(device: str, shapes: RoleShapes) -> _Change:
    """Double `model.sequence_parallel_size` (turning `model.remove_padding` on) while the rows are long and
    the pool and the attention heads have room for it; never for a vision-language model (SP would give the
    vision tower a slice of the tokens; the engines refuse it)."""

    def change(c: QuartetConfig) -> list[str]:
        if shapes.policy.model_type in VISION_MODEL_TYPES:
            return []
        new = 2 * c.model.sequence_parallel_size
        tp = c.model.tensor_parallel_size
        world = c.cluster.world_size
        if world % (new * tp) or shapes.policy.num_heads % new:
            return []
        if shapes.policy.is_moe and shape_problems(shapes.policy.model_type, sp=new):
            return []  # gpt-oss and DeepSeek-V3 under Ulysses are refused; Qwen-MoE runs it
        plan = estimate_memory(c, device=device, shapes=shapes)
        if activation_share(plan) < DOMINANT_SHARE:
            return []
        padding = [] if c.model.remove_padding else ["model.remove_padding=true"]
        return [*padding, f"model.sequence_parallel_size={new}"]

    return change


def _grow_tp(device: str, shapes: RoleShapes) -> _Change:
    """Double `model.tensor_parallel_size` while parameter-sized memory dominates and the pool, the heads
    and the vocabulary have room for it."""

    def change(c: QuartetConfig) -> list[str]:
        new = 2 * c.model.tensor_parallel_size
        sp = c.model.sequence_parallel_size
        world = c.cluster.world_size
        p = shapes.policy
        if world % (new * sp) or p.num_heads % new or p.num_kv_heads % new or p.vocab_size % new:
            return []
        if p.is_moe and moe_problems(new):
            return []
        plan = estimate_memory(c, device=device, shapes=shapes)
        if activation_share(plan, STATE_PARTS) < DOMINANT_SHARE:
            return []
        return [f"model.tensor_parallel_size={new}"]

    return change


EP_FREES = "model.expert_parallel_size"
"""The key whose change's line says how much memory it frees (`Change.freed`)."""


def _grow_ep(shapes: RoleShapes) -> _Change:
    """Raise `model.expert_parallel_size` to the next size the config's rules accept (a divisor of the world
    that divides the experts per layer, without tensor parallelism or LoRA: `config.parallel`), for a
    mixture-of-experts policy whose routed experts are most of its parameters."""

    def change(c: QuartetConfig) -> list[str]:
        p = shapes.policy
        m = c.model
        world = c.cluster.world_size
        if not p.is_moe or expert_params(p) < DOMINANT_SHARE * p.total_params:
            return []
        sp, tp = m.sequence_parallel_size, m.tensor_parallel_size
        for ep in range(m.expert_parallel_size + 1, world + 1):
            problems = layout_problems(sp, tp, m.lora.rank, ep=ep)
            problems += pool_problems(sp, tp, world, "the pool", ep=ep) + expert_problems(p.num_experts, ep)
            if not problems:
                return [f"{EP_FREES}={ep}"]
        return []

    return change


def _candidates(cfg: QuartetConfig, device: str, shapes: RoleShapes) -> Iterator[tuple[_Change, str]]:
    """(change, why), cheapest first: offloads that cost little time on a GPU, then smaller batches,
    then sequence parallelism for long rows, recomputation, tensor parallelism for large models, then the
    weights' offload."""
    gpu = device == "gpu"
    critic = plan_step(cfg).critic
    if gpu:
        yield (
            _switch("reference.param_offload", lambda c: c.reference.param_offload),
            "reference weights in host memory",
        )
        yield (
            _switch("actor.optimizer_offload", lambda c: c.actor.optimizer_offload),
            "actor AdamW states in host memory",
        )
        if critic:
            yield (
                _switch("critic.optimizer_offload", lambda c: c.critic.optimizer_offload),
                "critic AdamW states in host memory",
            )
    yield _grow_ep(shapes), "expert parallelism: a rank all-gathers only its group's experts of a layer"
    yield _halve_seqs, "fewer sequences in flight (KV cache, activations)"
    yield _halve_micro("actor", "logprobs"), "smaller log-prob micro-batch"
    yield _halve_micro("reference", "logprobs"), "smaller reference micro-batch"
    if critic:
        yield _halve_micro("critic", "values"), "smaller value micro-batch"
    yield _halve_micro("actor", ""), "smaller actor update micro-batch"
    if critic:
        yield _halve_micro("critic", ""), "smaller critic update micro-batch"
    yield _grow_sp(device, shapes), "sequence parallelism: each rank of a group runs 1/sp of the tokens"
    yield (
        _switch("model.gradient_checkpointing", lambda c: c.model.gradient_checkpointing),
        "gradient checkpointing",
    )
    yield _grow_tp(device, shapes), "tensor parallelism: layers and LM head split over tp ranks"
    if gpu:
        yield _switch("actor.param_offload", lambda c: c.actor.param_offload), "actor weights in host memory"
        if critic:
            yield (
                _switch("critic.param_offload", lambda c: c.critic.param_offload),
                "critic weights in host memory",
            )


def fit_config(
    cfg: QuartetConfig,
    *,
    device: str | None = None,
    capacity: Capacity | None = None,
    shapes: RoleShapes | None = None,
) -> FitReport:
    """The plan of `cfg` against `capacity` (None: this machine's free memory) and, when it does not fit, the
    cheapest changes that make it fit (module docstring)."""
    kind = resolve_device(cfg, device)
    shapes = shapes or resolve_shapes(cfg)
    capacity = capacity or detect_capacity(kind)
    plan = estimate_memory(cfg, device=kind, shapes=shapes)
    if _fits(plan, capacity):
        return FitReport(plan, capacity, hint=_room_hint(cfg, kind, capacity, shapes, plan))
    candidates = list(_candidates(cfg, kind, shapes))
    current = cfg
    current_plan = plan
    changes = []
    while not _fits(current_plan, capacity):  # each round applies the cheapest change that helps
        for change, reason in candidates:
            overrides = change(current)
            if not overrides:
                continue
            try:
                trial = validate(apply_overrides(current, overrides))
            except ConfigError:  # e.g. a micro-batch that no longer divides the mini-batch
                continue
            trial_plan = estimate_memory(trial, device=kind, shapes=shapes)
            if _pressure(trial_plan, capacity) < _pressure(current_plan, capacity):
                current, current_plan = trial, trial_plan
                changes.append(Change(tuple(overrides), reason, trial_plan.peak_device))
                break
        else:
            break  # nothing left that helps
    changes = _with_freed(_merge(changes), plan.peak_device)
    if not changes:
        return FitReport(plan, capacity)
    return FitReport(plan, capacity, tuple(changes), current, current_plan)


def _room_hint(
    cfg: QuartetConfig, device: str, capacity: Capacity, shapes: RoleShapes, plan: MemoryPlan
) -> Change | None:
    """Expert parallelism as a hint for a plan that fits with little room (`LITTLE_ROOM`), when the config
    rules accept it and it lowers the peak; None otherwise."""
    if plan.peak_device <= LITTLE_ROOM * HEADROOM * capacity.device_bytes:
        return None
    overrides = _grow_ep(shapes)(cfg)
    if not overrides:
        return None
    try:
        trial = estimate_memory(validate(apply_overrides(cfg, overrides)), device=device, shapes=shapes)
    except ConfigError:
        return None
    if trial.peak_device >= plan.peak_device:
        return None
    reason = "expert parallelism: a rank all-gathers only its group's experts of a layer"
    return Change(tuple(overrides), reason, trial.peak_device, plan.peak_device - trial.peak_device)


def _with_freed(changes: list[Change], peak: int) -> list[Change]:
    """`changes` with `freed` set on those of `EP_FREES`: the peak before the change less the peak after."""
    out = []
    for c in changes:
        freed = peak - c.peak_after if any(o.startswith(f"{EP_FREES}=") for o in c.overrides) else None
        out.append(dataclasses.replace(c, freed=freed))
        peak = c.peak_after
    return out


def _merge(changes: list[Change]) -> list[Change]:
    """Repeated changes of the same keys as one change with their final values (a second doubling of
    `model.sequence_parallel_size` updates the change that also turned `model.remove_padding` on)."""
    merged: list[Change] = []
    for c in changes:
        new = dict(o.split("=", 1) for o in c.overrides)
        if merged:
            last = dict(o.split("=", 1) for o in merged[-1].overrides)
            if set(new) <= set(last):
                overrides = tuple(f"{k}={v}" for k, v in (last | new).items())
                merged[-1] = dataclasses.replace(c, overrides=overrides, reason=merged[-1].reason)
                continue
        merged.append(c)
    return merged
