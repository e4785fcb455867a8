"""Estimate the memory of one RL step on one bundle from the config alone: `estimate_memory(cfg)`.

Every role the config starts on the main pool shares the bundle (the single-device case: actor, rollout
engine, reference, critic, reward model in one process). A role on a pool of its own
(`cluster.separate_pools`) is left out when that pool has devices of its own, and counted at its own peak
in every phase when it shares the bundle's memory (GPU pools on fractions of one GPU,
`cluster.gpu_fraction`; on CPU, every pool of a one-node run): it runs while the main pool does. Per role:

    actor       float32 weights (+ LoRA adapters), AdamW exp_avg + exp_avg_sq (float32) of the trainable
                parameters, float32 gradients during its update only (the engine frees them after the step)
    rollout     its own copy of the policy in `rollout.dtype` (its projections in fp8 with
                `rollout.quantization=fp8`: `rollout_weights`), and the KV cache during generation (freed
                while training with `rollout.sleep_while_training`)
    reference   float32 weights, frozen (absent with LoRA: the actor serves it with adapters disabled)
    critic      float32 value model (trunk + score head), AdamW states, gradients during its update (a
                vision-language critic keeps the vision tower, frozen or not as `model.freeze_vision_tower`)
    reward      float32 reward model, frozen
    teacher     float32 weights of `teacher.model_path`'s model, frozen (on-policy distillation)

On CPU an update also counts the heap space of the previous step's freed gradients, which glibc keeps
(`CPU_GRAD_RETENTION`).

The engines keep float32 master weights whatever `model.dtype` says and compute under autocast
(`<role>.mixed_precision`), so there is no separate master copy. Working memory of the phase a role works in
comes from `activations` (micro-batch of the phase's planned size, every row at its maximum length), plus
a vision-language model's tower over the micro-batch's image tokens (`planning.vision`: every prompt token
counted as one; kept for backward only when the tower trains). The
update's peak is the larger of the micro-batch's forward/backward and the optimizer step's temporaries
(AdamW on GPU uses foreach kernels: one float32 temporary per trainable parameter; on CPU it steps one
tensor at a time: two temporaries of the largest one). Optimizer states are planned in the steady state
(they appear at the first step).

On GPU, switches with `offload` put a role's weights or optimizer states in host memory outside its own
phases. On CPU nothing moves (the engines skip offloading when the device is the host), device and host
are one memory and the plan's peak is their sum.

With several bundles (world size > 1), FSDP2 shards a training engine's weights, gradients and optimizer
states over them; a computing engine also holds the all-gathered root parameters (embedding, head, final
norm) and two layers (the running one and the prefetched next). The policy's engines may also split each
micro-batch's tokens over a sequence group and the layers over a tensor group; every figure is per rank
(`planning.parallel` says what divides by what). Measured with 2-rank gloo engines on CPU (data and
sequence parallel, tests/planning); the GPU side and tensor parallelism are estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

from quartet.config.cluster import DeviceKind
from quartet.config.model import Dtype
from quartet.config.plan import RefLogprobs, plan_step
from quartet.config.roles import ActorConfig, CriticConfig, Role
from quartet.config.rollout import RolloutEngineKind
from quartet.config.root import QuartetConfig
from quartet.engines.precision import resolve_precision
from quartet.planning.activations import (
    F32,
    MicroBatch,
    forward_working_bytes,
    kv_cache_bytes,
    prefill_tokens,
    rollout_working_bytes,
    train_working_bytes,
)
from quartet.planning.experts import expert_note, expert_shard, record_bytes_per_token, routing_parts
from quartet.planning.model_shape import HeadKind, ModelShape
from quartet.planning.notes import plan_notes, shares_memory
from quartet.planning.parallel import (
    POLICY_ROLES,
    Layout,
    fused_head_on,
    gathered_params,
    layout_of,
    state_bytes,
    tp_linear_params,
)
from quartet.planning.plan import MemoryPlan, Phase, PlanRow
from quartet.planning.role_shapes import RoleShapes, resolve_shapes
from quartet.planning.rollout_weights import rollout_weight_bytes
from quartet.planning.vision import vision_activation_bytes
from quartet.planning.workload import Workload

__all__ = ["DTYPE_BYTES", "estimate_memory", "resolve_device"]

DTYPE_BYTES = {Dtype.FLOAT32: 4, Dtype.BFLOAT16: 2, Dtype.FLOAT16: 2}

CPU_RUNTIME_BYTES = 16 * 2**20
"""What a working phase holds on CPU beyond its tensors: allocator arenas, per-op scratch buffers, the
Python objects of the pass. Measured 14-27 MiB for tiny models (tests/planning), where it dominates."""

CPU_ROLLOUT_RUNTIME_BYTES = 12 * 2**20
"""The same for the rollout engine's generation (no autograd): measured 13-14 MiB beyond its tensors."""

CPU_DIST_RUNTIME_BYTES = 20 * 2**20
"""What a working phase holds on CPU with world size > 1 beyond the single-rank runtime: the gloo process
group and its threads' buffers, the device meshes, FSDP2's and DTensor's state and dispatch caches. Measured
per rank with 2-rank gloo engines on a ~1M-parameter model and 8-token rows, where nothing else grows:
19.5-24 MiB above the plan without it (tests/planning, data and sequence parallel alike)."""

CPU_GRAD_RETENTION = 1.0
"""On CPU (glibc malloc), the memory of one more set of gradients stays resident during an update, as a
fraction of the gradients' size. `zero_grad(set_to_none=True)` returns the last step's gradients to
malloc's heap, not to the OS (glibc raises its mmap threshold to 32 MiB after the first large frees, so
tensors below it live in the heap); the next forward's activations take that space piece by piece, and the
new gradients need fresh pages. Measured at ~110M parameters: a steady-state update peaks 0.49 GiB (1.3x
the gradients) above its live tensors, and with `MALLOC_MMAP_THRESHOLD_=131072` (every large tensor
returned to the OS when freed) the peak falls to the live tensors the plan counts (2.02 GiB measured vs
2.06 planned), at 35% more step time. That is why quartet does not set it, and why the plan counts it."""


def resolve_device(cfg: QuartetConfig, device: DeviceKind | str | None = None) -> str:
    """`cpu` or `gpu`: the argument, else `cluster.device`; `auto` asks torch whether CUDA is there."""
    kind = DeviceKind(device) if device is not None else cfg.cluster.device
    if kind is DeviceKind.AUTO:
        import torch

        return "gpu" if torch.cuda.is_available() else "cpu"
    return kind.value


@dataclass(frozen=True)
class _Engine:
    """One training-engine role (actor, reference, critic, reward model) and where its state lives."""

    role: Role
    shape: ModelShape
    head: HeadKind
    params: int
    trainable: int
    compute: frozenset[Phase]
    update: Phase | None = None
    param_offload: bool = False
    optimizer_offload: bool = False


def _engines(cfg: QuartetConfig, shapes: RoleShapes) -> list[_Engine]:
    lora = cfg.model.lora if cfg.model.lora.rank > 0 else None
    policy = shapes.policy
    ref = plan_step(cfg).ref_logprobs
    actor_params = policy.params() + (policy.lora_params(lora) if lora else 0)
    frozen = policy.vision_params if cfg.model.freeze_vision_tower else 0  # no gradient, no Adam state
    actor_phases = {Phase.OLD_LOG_PROB, Phase.UPDATE_ACTOR} | (
        {Phase.REF} if ref is RefLogprobs.ACTOR else set()
    )
    out = [
        _Engine(
            Role.ACTOR,
            policy,
            HeadKind.CAUSAL_LM,
            actor_params,
            policy.lora_params(lora) if lora else actor_params - frozen,
            frozenset(actor_phases),
            Phase.UPDATE_ACTOR,
            cfg.actor.param_offload,
            cfg.actor.optimizer_offload,
        )
    ]
    if ref is RefLogprobs.REFERENCE:
        out.append(
            _Engine(
                Role.REFERENCE,
                policy,
                HeadKind.CAUSAL_LM,
                policy.params(),
                0,
                frozenset({Phase.REF}),
                param_offload=cfg.reference.param_offload,
            )
        )
    if shapes.critic is not None:
        n = shapes.critic.params(HeadKind.VALUE)
        critic_frozen = shapes.critic.vision_params if cfg.model.freeze_vision_tower else 0
        out.append(
            _Engine(
                Role.CRITIC,
                shapes.critic,
                HeadKind.VALUE,
                n,
                n - critic_frozen,
                frozenset({Phase.VALUES, Phase.UPDATE_CRITIC}),
                Phase.UPDATE_CRITIC,
                cfg.critic.param_offload,
                cfg.critic.optimizer_offload,
            )
        )
    if shapes.reward is not None:
        n = shapes.reward.params(HeadKind.REWARD)
        out.append(
            _Engine(Role.REWARD_MODEL, shapes.reward, HeadKind.REWARD, n, 0, frozenset({Phase.REWARD}))
        )
    if shapes.teacher is not None:
        out.append(_teacher_engine(cfg, shapes.teacher))
    return out


def _teacher_engine(cfg: QuartetConfig, shape: ModelShape) -> _Engine:
    """The distillation teacher: frozen, its own shape, computing in phase `teacher` only."""
    n = shape.params(HeadKind.CAUSAL_LM)
    offload = cfg.teacher.param_offload
    return _Engine(
        Role.TEACHER, shape, HeadKind.CAUSAL_LM, n, 0, frozenset({Phase.TEACHER}), param_offload=offload
    )


def _phases(cfg: QuartetConfig, shapes: RoleShapes) -> list[Phase]:
    out = [Phase.GEN]
    if shapes.reward is not None:
        out.append(Phase.REWARD)
    out.append(Phase.OLD_LOG_PROB)
    if plan_step(cfg).ref_logprobs is not RefLogprobs.NONE:
        out.append(Phase.REF)
    if shapes.teacher is not None:
        out.append(Phase.TEACHER)
    if shapes.critic is not None:
        out += [Phase.VALUES, Phase.UPDATE_CRITIC]
    return [*out, Phase.UPDATE_ACTOR]


def _lora_inputs(cfg: QuartetConfig, shape: ModelShape) -> int:
    if cfg.model.lora.rank <= 0:
        return 0
    shapes = shape.linear_shapes()
    targets = set(cfg.model.lora.target_modules)
    if "all-linear" in targets:
        targets |= set(shapes)
    return sum(shapes[name][0] for name in targets if name in shapes)


@dataclass(frozen=True)
class _Split:
    """How engine `e`'s passes run: its layout over the ranks, packed rows, the fused LM head."""

    layout: Layout
    packed: bool
    fused: bool


def _split(cfg: QuartetConfig, e: _Engine, device: str) -> _Split:
    policy, layout = e.role in (*POLICY_ROLES, Role.TEACHER), layout_of(cfg, e.role)
    return _Split(  # under SP the engine packs whatever `model.remove_padding` says
        layout,
        layout.sp > 1 or (policy and cfg.model.remove_padding),
        policy and fused_head_on(cfg, device),
    )


def _working(cfg: QuartetConfig, e: _Engine, phase: Phase, load: Workload) -> dict[str, int]:
    """Working memory of engine `e` computing in `phase` on one rank (excluding its resident state)."""
    c = DTYPE_BYTES[resolve_precision((cfg.critic if e.role is Role.CRITIC else cfg.actor).mixed_precision)]
    sp = _split(cfg, e, load.device)
    if phase is Phase.UPDATE_ACTOR or phase is Phase.UPDATE_CRITIC:
        work = _update_working(cfg, e, phase, load, c, sp)
    else:
        work = _forward_working(cfg, e, phase, load, c, sp)
    gathered = gathered_params(e.shape, e.head, sp.layout)
    if gathered:
        work["fsdp_gather"] = F32 * gathered
    return work


def _update_working(
    cfg: QuartetConfig, e: _Engine, phase: Phase, load: Workload, c: int, sp: _Split
) -> dict[str, int]:
    """A micro-batch's forward + backward, or the optimizer step's temporaries when those are larger."""
    lora, tp = cfg.model.lora.rank > 0, sp.layout.tp
    rc: ActorConfig | CriticConfig = cfg.actor if phase is Phase.UPDATE_ACTOR else cfg.critic
    trainable_linear = 0 if lora and e.role is Role.ACTOR else tp_linear_params(e.shape, e.head, tp)
    mb = load.update(rc, sp.layout, sp.packed)
    work = train_working_bytes(
        e.shape,
        mb,
        c,
        head=e.head,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        trainable_linear_params=trainable_linear if c < F32 else 0,
        lora_inputs=_lora_inputs(cfg, e.shape) if e.role is Role.ACTOR else 0,
        entropy=phase is Phase.UPDATE_ACTOR and cfg.actor.entropy_coeff > 0,
        tp=tp,
        fused_head=sp.fused,
        ep=sp.layout.ep,
        gkd_top_k=cfg.algorithm.gkd_top_k
        if phase is Phase.UPDATE_ACTOR and cfg.algorithm.gkd_coef > 0
        else 0,
    )
    trains_tower = not cfg.model.freeze_vision_tower and not (lora and e.role is Role.ACTOR)
    work.update(_vision_working(cfg, e.shape, mb, c, trains=trains_tower))
    step = _optimizer_step_bytes(cfg, e, load)
    return {"optimizer_step": step} if step > sum(work.values()) else work


def _forward_working(
    cfg: QuartetConfig, e: _Engine, phase: Phase, load: Workload, c: int, sp: _Split
) -> dict[str, int]:
    """A no-grad pass's micro-batch (old log-probs, reference, values, reward scores)."""
    micro = {
        Phase.OLD_LOG_PROB: cfg.actor.logprobs,
        Phase.REF: cfg.reference.logprobs,
        Phase.TEACHER: cfg.teacher.logprobs,
        Phase.VALUES: cfg.critic.values,
    }
    if phase is Phase.REWARD:
        mb = load.micro(load.rows_per_step, cfg.reward.micro_batch_size_per_device, False, 0)
    else:
        mb = load.no_grad(micro[phase], sp.layout, sp.packed)
    work = forward_working_bytes(
        e.shape,
        mb,
        c,
        head=e.head,
        with_entropy=phase is Phase.OLD_LOG_PROB,
        caches_weights=e.trainable > 0 and cfg.model.lora.rank <= 0,
        tp=sp.layout.tp,
        fused_head=sp.fused,
        ep=sp.layout.ep,
    )
    return work | _vision_working(cfg, e.shape, mb, c, trains=False)


def _vision_working(
    cfg: QuartetConfig, shape: ModelShape, mb: MicroBatch, c: int, *, trains: bool
) -> dict[str, int]:
    """The vision tower's share (`planning.vision`) over the micro-batch's prompt tokens, all counted as
    image tokens; nothing for a text model."""
    if shape.vision is None:
        return {}
    image_tokens = mb.tokens * min(cfg.data.max_prompt_length, mb.seq_len) // max(mb.seq_len, 1)
    return {"vision": vision_activation_bytes(shape.vision, image_tokens, c, trains=trains)}


def _optimizer_step_bytes(cfg: QuartetConfig, e: _Engine, load: Workload) -> int:
    """Temporaries of one AdamW step on one rank (see the module doc): every tensor is this rank's shard."""
    if load.device == "gpu":  # foreach: one float32 temporary per trainable parameter (sqrt of exp_avg_sq)
        return F32 * e.trainable // load.world
    s = e.shape
    widths = (s.hidden_size, s.mlp_width, s.q_dim)
    if e.role is Role.ACTOR and cfg.model.lora.rank > 0:  # the widest adapter matrix
        largest = cfg.model.lora.rank * max(
            *widths, s.vocab_size if "lm_head" in cfg.model.lora.target_modules else 0
        )
    else:  # the embedding, or the widest layer matrix
        largest = max(s.vocab_size * s.hidden_size, s.hidden_size * max(widths), s.expert_tensor_params)
    return 2 * F32 * min(largest, e.trainable) // load.world


def _engine_row(cfg: QuartetConfig, e: _Engine, phase: Phase, load: Workload, unified: bool) -> PlanRow:
    dev: dict[str, int] = {}
    host: dict[str, int] = {}
    layout = layout_of(cfg, e.role)

    def put(name: str, nbytes: int, offloaded: bool) -> None:
        if offloaded and not unified:
            host[f"host.{name}"] = nbytes
        else:
            dev[name] = nbytes

    working = phase in e.compute
    put("weights", state_bytes(e.params, F32, layout, e.shape), e.param_offload and not working)
    trains_experts = e.shape if not (e.role is Role.ACTOR and cfg.model.lora.rank > 0) else None
    if e.trainable:
        optimizer = state_bytes(e.trainable, 2 * F32, layout, trains_experts)
        put("optimizer", optimizer, e.optimizer_offload and phase is not e.update)
    if phase is e.update:
        dev["grads"] = state_bytes(e.trainable, F32, layout, trains_experts)
        if unified:
            dev["freed_grads"] = int(CPU_GRAD_RETENTION * dev["grads"])
    if working:
        dev.update(_working(cfg, e, phase, load))
        if e.role in POLICY_ROLES:  # the batch's routing record, and the micro-batch's int64 copy
            tokens = load.policy_tokens(phase)
            dev.update(routing_parts(cfg, e.shape, e.role, phase, load.rows_per_step, tokens))
        if unified:
            dev["runtime"] = CPU_RUNTIME_BYTES + (CPU_DIST_RUNTIME_BYTES if layout.world > 1 else 0)
    return PlanRow(phase, e.role, sum(dev.values()), sum(host.values()), dev | host)


def _rollout_row(cfg: QuartetConfig, policy: ModelShape, phase: Phase, load: Workload) -> PlanRow:
    rc = cfg.rollout
    r = DTYPE_BYTES[rc.dtype]
    dev = {"weights": rollout_weight_bytes(policy, r, rc.quantization)}
    if phase is Phase.GEN or not rc.sleep_while_training:
        slots, per_slot = load.kv_tokens()
        if rc.engine is RolloutEngineKind.VLLM:  # preallocated to the token budget, no rounding
            dev["kv_cache"] = (rc.kv_cache_tokens or slots * per_slot) * policy.kv_bytes_per_token(r)
        else:
            dev["kv_cache"] = kv_cache_bytes(policy, slots, per_slot, r)
    if phase is Phase.GEN:
        groups = min(load.prompts_per_step, max(1, rc.max_num_seqs // rc.n))
        samples = min(load.rows_per_step, rc.max_num_seqs)
        dev.update(rollout_working_bytes(policy, groups, cfg.data.max_prompt_length, samples, r))
        if policy.vision is not None:  # the prefill runs the tower over its prompts' image tokens
            tokens = prefill_tokens(groups, cfg.data.max_prompt_length)
            dev["vision"] = vision_activation_bytes(policy.vision, tokens, r, trains=False)
        if load.device == "cpu":
            dev["runtime"] = CPU_ROLLOUT_RUNTIME_BYTES
        dev.update(routing_parts(cfg, policy, Role.ROLLOUT, phase, load.rows_per_step, 0))
    return PlanRow(phase, Role.ROLLOUT, sum(dev.values()), 0, dev)


def _sizes(cfg: QuartetConfig, load: Workload, shapes: RoleShapes) -> dict[str, int]:
    """The workload the plan assumed: tokens are those one rank runs in one micro-batch of each phase."""
    slots, per_slot = load.kv_tokens()
    layout = layout_of(cfg, Role.ACTOR)
    sizes = {
        "seq_len": load.seq_len,
        "rows_per_step": load.rows_per_step,
        "kv_cache_tokens": slots * per_slot,
        "data_parallel_size": layout.dp,
        "sequence_parallel_size": layout.sp,
        "tensor_parallel_size": layout.tp,
        "expert_parallel_size": layout.ep,
        "old_log_prob_tokens": load.policy_tokens(Phase.OLD_LOG_PROB),
        "update_actor_tokens": load.policy_tokens(Phase.UPDATE_ACTOR),
        "policy_params": shapes.policy.params(),
    }
    if plan_step(cfg).ref_logprobs is not RefLogprobs.NONE:
        sizes["ref_tokens"] = load.policy_tokens(Phase.REF)
    if shapes.policy.is_moe:  # the experts of each MoE layer one rank holds (`planning.experts`)
        sizes["experts_per_rank"] = expert_shard(shapes.policy, layout.world, layout.ep)
        sizes["routing_bytes_per_token"] = record_bytes_per_token(shapes.policy)
    if shapes.critic is not None:
        sizes["values_tokens"] = load.no_grad(cfg.critic.values).tokens
        sizes["update_critic_tokens"] = load.update(cfg.critic).tokens
    return sizes


def _expert_notes(cfg: QuartetConfig, policy: ModelShape, load: Workload) -> tuple[str, ...]:
    c = DTYPE_BYTES[resolve_precision(cfg.actor.mixed_precision)]
    note = expert_note(cfg, policy, load.policy_tokens(Phase.UPDATE_ACTOR), c)
    return (note,) if note else ()


def _placed(cfg: QuartetConfig, device: str, rows: list[PlanRow]) -> tuple[PlanRow, ...]:
    """The rows of the main bundle's memory: its own roles phase by phase, each separate pool sharing that
    memory at its own peak in every phase (it runs concurrently: a rollout pool generates while the actor
    trains), and none of a separate pool on a device of its own."""
    separate = set(cfg.cluster.separate_pools)
    near = {r for r in separate if shares_memory(cfg, device, r)}
    peaks = {
        role: max((r for r in rows if r.role == role), key=lambda r: r.total_bytes)
        for role in near
        if any(r.role == role for r in rows)
    }
    out: list[PlanRow] = []
    for row in rows:
        if row.role not in separate:
            out.append(row)
        elif row.role in peaks:
            peak = peaks[row.role]
            out.append(PlanRow(row.phase, row.role, peak.device_bytes, peak.host_bytes, peak.breakdown))
    return tuple(out)


def estimate_memory(
    cfg: QuartetConfig, *, device: DeviceKind | str | None = None, shapes: RoleShapes | None = None
) -> MemoryPlan:
    """The memory plan of one bundle for `cfg` (pure arithmetic once the shapes are known).

    Args:
        cfg: the run's configuration.
        device: `cpu` or `gpu`; None uses `cluster.device` (`auto`: GPU when torch sees CUDA).
        shapes: model shapes; None reads them with `resolve_shapes(cfg)` (config.json files only).
    """
    kind = resolve_device(cfg, device)
    shapes = shapes or resolve_shapes(cfg)
    load = Workload(cfg, kind)
    engines = _engines(cfg, shapes)
    rows: list[PlanRow] = []
    for phase in _phases(cfg, shapes):
        rows += [_engine_row(cfg, e, phase, load, kind == "cpu") for e in engines if e.role is Role.ACTOR]
        rows.append(_rollout_row(cfg, shapes.policy, phase, load))
        rows += [_engine_row(cfg, e, phase, load, kind == "cpu") for e in engines if e.role is not Role.ACTOR]
    return MemoryPlan(
        rows=_placed(cfg, kind, rows),
        device=kind,
        world_size=load.world,
        sequence_parallel=cfg.model.sequence_parallel_size,
        tensor_parallel=cfg.model.tensor_parallel_size,
        expert_parallel=cfg.model.expert_parallel_size,
        notes=plan_notes(cfg, kind) + _expert_notes(cfg, shapes.policy, load),
        sizes=_sizes(cfg, load, shapes),
    )
