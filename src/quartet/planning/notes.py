"""The notes under a memory plan: what its figures assume, in words (`MemoryPlan.notes`), and which model
they are for (`planned_model`, `unnamed_model_note`: what `quartet plan` prints around the plan)."""

from __future__ import annotations

from quartet.config.cluster import DeviceKind
from quartet.config.model import TinyModelConfig
from quartet.config.roles import Role
from quartet.config.rollout import RolloutEngineKind
from quartet.config.root import QuartetConfig
from quartet.planning.model_shape import ModelShape
from quartet.planning.parallel import fused_head_on, layout_of

__all__ = ["plan_notes", "planned_model", "shares_memory", "unnamed_model_note"]


def plan_notes(cfg: QuartetConfig, device: str) -> tuple[str, ...]:
    """The assumptions a plan of `cfg` on `device` rests on, in words (printed under its table)."""
    notes = [
        "every row planned at max_prompt_length + max_response_length tokens; AdamW states in steady state",
    ]
    if device == "cpu":
        notes.append("cpu: device and host are one memory; offload switches move nothing; peaks are combined")
    elif cfg.actor.param_offload or cfg.actor.optimizer_offload or cfg.critic.param_offload:
        notes.append(
            "actor/critic offload assumed between the role's own phases (offload()/onload() around them)"
        )
    away = [str(r) for r in cfg.cluster.separate_pools if not shares_memory(cfg, device, r)]
    near = [str(r) for r in cfg.cluster.separate_pools if shares_memory(cfg, device, r)]
    if away:
        notes.append(f"roles on pools of their own are not on this bundle: {', '.join(away)}")
    if near:
        where = "host memory" if device == "cpu" else "this GPU"
        shares = " + ".join(f"{p} {f:g}" for p, f in cfg.cluster.sharing_pools.items())
        notes.append(
            f"pools of their own sharing {where}: {', '.join(near)}"
            + (f" (cluster.gpu_fraction: {shares})" if device == "gpu" else "")
            + "; each runs beside the main pool, so its own peak is counted in every phase"
        )
    notes += _parallel_notes(cfg, device)
    if cfg.actor.use_dynamic_batch or cfg.critic.use_dynamic_batch:
        notes.append("token budgets assumed filled with full-length rows (mixed lengths pad more)")
    if cfg.rollout.engine is RolloutEngineKind.VLLM:
        notes.append(
            "vLLM: weights and KV cache only; its own workspace (CUDA graphs, sampler) is not modelled"
        )
    if cfg.model.is_tiny:
        notes.append(
            "tiny model: vocabulary planned at model.tiny.vocab_size (the trained tokenizer may be smaller)"
        )
    return tuple(notes)


def _parallel_notes(cfg: QuartetConfig, device: str) -> list[str]:
    """What the plan assumes about sharding, sequence and tensor parallelism, and the LM head."""
    out = []
    layout = layout_of(cfg, Role.ACTOR)
    if layout.world > 1:
        out.append(
            f"world size {layout.world}: FSDP2 sharding estimated (1/world of states + gathered root and 2 "
            "layers)"
        )
    if layout.sp > 1 or layout.tp > 1:
        out.append(
            f"policy engines: dp {layout.dp} x sp {layout.sp} x tp {layout.tp}; a micro-batch holds the rows "
            f"of sp x tp = {layout.sp * layout.tp} ranks, split by tokens over sp and by heads/columns over "
            "tp"
        )
    critic_sp = cfg.critic.sequence_parallel_size
    if critic_sp > 1 and cfg.algorithm.needs_critic:
        out.append(f"critic engine: sp {critic_sp} (critic.sequence_parallel_size), packed; no tp")
    if cfg.model.remove_padding:
        out.append("policy passes packed (model.remove_padding): no attention masks")
        if cfg.model.shared_prompts and cfg.model.sequence_parallel_size == 1 and cfg.rollout.n > 1:
            out.append("rows sharing a prompt run it once in the policy's passes (model.shared_prompts)")
    if fused_head_on(cfg, device):
        out.append("fused LM head: the policy's logits exist one vocabulary block at a time")
    return out


def shares_memory(cfg: QuartetConfig, device: str, role: Role) -> bool:
    """Whether separate role `role`'s pool uses the main bundle's memory: always on CPU (one host's memory;
    every pool of a run on one node), on GPU when both pools take a fraction of one GPU."""
    if device == "cpu":
        return cfg.cluster.nodes == 1
    return cfg.cluster.shares_gpu(role) and cfg.cluster.shares_gpu("main")


def planned_model(cfg: QuartetConfig, policy: ModelShape) -> str:
    """The policy a plan is for, in words: `model.path`'s folder, or the built-in tiny model of `model.tiny`
    (its parameters counted at `model.tiny.vocab_size`, as the plan counts them); a mixture-of-experts
    model's total and active parameters."""
    params = f"{policy.total_params:,} parameters"
    if policy.is_moe:  # weights are sized by the total, activations by what one token runs
        params += f", {policy.active_params:,} active per token: {policy.experts_per_token} of "
        params += f"{policy.num_experts} experts"
    if cfg.model.path:
        return f"{cfg.model.path} ({policy.model_type}, {params})"
    tiny = cfg.model.tiny
    return (
        f"the built-in tiny model (model.tiny: {tiny.arch}, hidden {tiny.hidden_size}, "
        f"{tiny.num_hidden_layers} layers, {params})"
    )


def unnamed_model_note(cfg: QuartetConfig, device: str) -> str | None:
    """A warning for a GPU config that names no model (None otherwise): no `model.path` and `model.tiny` at
    its defaults, with `cluster.device: gpu` or planned for a GPU. Such a preset (examples/single_gpu) expects
    a model folder; its plan is the default tiny model's, which says nothing about a real one. A config that
    sets `model.tiny` chose its tiny model (a GPU demo), and on CPU the default tiny model is the normal case:
    no note for either."""
    if cfg.model.path or cfg.model.tiny != TinyModelConfig():
        return None
    if cfg.cluster.device is not DeviceKind.GPU and device != "gpu":
        return None
    return (
        "this GPU config names no model: it expects a model folder (pass model.path=DIR, a Hugging Face "
        "causal LM's folder); this plan's figures are for the built-in tiny model and say nothing about "
        "the memory of a real one"
    )
