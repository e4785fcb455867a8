"""The model roles of a run by name (`Role`), and the sections of the trained and frozen ones: actor
(policy), critic (values), reference (frozen policy)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quartet.config.errors import require
from quartet.config.model import Dtype
from quartet.config.optim import OptimConfig
from quartet.core.choices import KLPenalty, LossAggMode, PolicyLoss, TISMode

__all__ = [
    "ActorConfig",
    "CriticConfig",
    "MicroBatching",
    "ReferenceConfig",
    "Role",
    "RoutingReplay",
    "TeacherConfig",
]


class Role(StrEnum):
    """The model roles of an RL run: one group of workers each. A value is also the role's name wherever
    a name is shown or written (pool labels, worker names, errors, checkpoint folders)."""

    ACTOR = "actor"
    ROLLOUT = "rollout"
    REFERENCE = "reference"
    CRITIC = "critic"
    REWARD_MODEL = "reward_model"
    TEACHER = "teacher"


class RoutingReplay(StrEnum):
    """Which experts a mixture-of-experts policy's training passes route each token to."""

    OFF = "off"
    """The trainer's own router picks the top-k (it may differ from what the rollout engine picked)."""
    ROLLOUT = "rollout"
    """The experts the rollout engine picked for the token (R3, docs/moe_routing_replay.md); the gate's
    weights are its softmax at those experts, so the router still gets a gradient."""


@dataclass(frozen=True)
class MicroBatching:
    """How one device splits its share of a batch for forward passes that need no gradient."""

    micro_batch_size_per_device: int = 16
    """Responses per forward pass on one device (per device, counts responses)."""

    use_dynamic_batch: bool = False
    """Pack responses by `max_tokens_per_micro_batch` instead of a fixed count."""

    max_tokens_per_micro_batch: int = 4096
    """Token budget (prompt + response) of one micro-batch on one device, with `use_dynamic_batch`."""

    def __post_init__(self) -> None:
        require(self.micro_batch_size_per_device > 0, "micro_batch_size_per_device", "must be > 0")
        require(self.max_tokens_per_micro_batch > 0, "max_tokens_per_micro_batch", "must be > 0")


def _check_update_sizes(cfg: ActorConfig | CriticConfig) -> None:
    require(
        cfg.mini_batch_size > 0,
        "mini_batch_size",
        "must be > 0",
        "set a positive number of prompts per update",
    )
    require(cfg.micro_batch_size_per_device > 0, "micro_batch_size_per_device", "must be > 0")
    require(cfg.max_tokens_per_micro_batch > 0, "max_tokens_per_micro_batch", "must be > 0")
    require(cfg.epochs > 0, "epochs", "must be > 0", "use 1 for one pass over each batch")


def _check_moe_coefs(cfg: ActorConfig | CriticConfig) -> None:
    aux = cfg.moe_aux_loss_coef
    require(aux is None or aux >= 0, "moe_aux_loss_coef", f"must be >= 0 or null, got {aux}", "use 0 for off")
    require(cfg.moe_z_loss_coef >= 0, "moe_z_loss_coef", f"must be >= 0, got {cfg.moe_z_loss_coef}")


@dataclass(frozen=True)
class ActorConfig:
    """The policy being trained: its update schedule, loss and memory switches."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=5e-5))
    """Optimizer of the policy."""

    mini_batch_size: int = 4
    """Prompts per optimizer step, global (times `rollout.n` responses); divides `data.train_batch_size`."""

    micro_batch_size_per_device: int = 8
    """Responses per forward/backward on one device (per device); gradients accumulate over micro-batches."""

    use_dynamic_batch: bool = False
    """Pack micro-batches by `max_tokens_per_micro_batch` instead of `micro_batch_size_per_device`."""

    max_tokens_per_micro_batch: int = 4096
    """Token budget (prompt + response) of one micro-batch on one device, with `use_dynamic_batch`."""

    epochs: int = 1
    """Passes over each step's batch (PPO epochs)."""

    shuffle: bool = True
    """Shuffle responses between mini-batches within a step."""

    policy_loss: str = PolicyLoss.PPO
    """Surrogate objective: `ppo`, `gspo`, `reinforce`, or a name registered with `@register_policy_loss`
    in `algorithm.custom_module` (checked by the config's validation)."""

    clip_ratio_low: float = 0.2
    """Lower clip of the importance ratio: ratio >= 1 - clip_ratio_low."""

    clip_ratio_high: float = 0.2
    """Upper clip: ratio <= 1 + clip_ratio_high (DAPO's clip-higher raises it, e.g. 0.28)."""

    dual_clip_c: float = 0.0
    """Dual-clip constant for negative advantages (> 1 enables it, 3.0 is usual; 0 disables)."""

    loss_agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN
    """Reduction of per-token losses to a scalar."""

    loss_agg_norm_constant: int = 0
    """Dr.GRPO's constant of `seq-mean-token-sum-norm`; 0 uses `data.max_response_length`."""

    entropy_coeff: float = 0.0
    """Weight of the entropy bonus."""

    entropy_chunk_size: int = 1024
    """Tokens per chunk when computing entropy from logits (bounds memory on long vocabularies)."""

    use_kl_loss: bool = False
    """Add a KL(pi || pi_ref) term to the actor loss (GRPO style); needs the reference."""

    kl_loss_coef: float = 0.001
    """Weight of the KL loss term."""

    kl_loss_type: KLPenalty = KLPenalty.LOW_VAR_KL
    """Estimator used for the KL loss term."""

    tis_cap: float = 0.0
    """Cap of truncated importance weights between rollout and trainer log-probs (TIS); 0 disables. The
    trainer's log-probs are those of the policy at the start of the update (the proximal policy of
    decoupled PPO), so with off-policy samples (`trainer.mode=async`) the PPO ratio clips against the
    proximal policy and this weight corrects from the engine that sampled to it."""

    tis_mode: TISMode = TISMode.TRUNCATE
    """`truncate`: weight min(ratio, tis_cap) (TIS). `mask`: weight 1 inside [tis_mask_low, tis_cap] and 0
    outside, so tokens the behaviour policy saw very differently drop out of the loss (masked IS)."""

    tis_mask_low: float = 0.5
    """`tis_mode=mask`: the lower end of the band of importance ratios kept."""

    reuse_update_logprobs: bool = True
    """When a step's update is ONE optimizer step over the whole batch (epochs 1, mini_batch_size =
    data.train_batch_size, no KL penalty in the reward), the old policy is the one being updated: the update
    takes its own log-probs, detached, as the old ones (ratio exactly 1, same gradient) and the no-grad
    old-log-prob pass is skipped (TRL does the same). False always runs the pass."""

    logprobs: MicroBatching = field(default_factory=MicroBatching)
    """Micro-batching of the log-prob pass (no gradient) that gives the old log-probs."""

    mixed_precision: Dtype = Dtype.AUTO
    """Autocast dtype of forward/backward (float32 turns autocast off); master weights stay in model.dtype.
    `auto`: bfloat16 on a GPU that has it, and on a CPU where a measured bf16 matmul beats fp32 (AMX), else
    float32 (`quartet doctor` shows the figures; QUARTET_AUTO_PRECISION pins it)."""

    param_offload: bool = False
    """Keep parameters in host memory between uses (GPU only; no-op on CPU)."""

    optimizer_offload: bool = False
    """Keep optimizer states in host memory between updates (GPU only; no-op on CPU)."""

    routing_replay: RoutingReplay = RoutingReplay.OFF
    """Mixture-of-experts policies: `rollout` routes every token of the old-log-prob pass, the reference
    pass and the update to the experts the rollout engine recorded for it (routing replay, R3; implies
    `rollout.record_routing`); `off` lets the trainer's router choose. Needs an MoE model and the built-in
    engine with single-turn batch generation (docs/moe_routing_replay.md)."""
    moe_aux_loss_coef: float | None = None
    """Mixture-of-experts policies: weight of the router's load-balancing loss (Switch Transformer's, as
    transformers' `load_balancing_loss_func` computes it over all non-pad tokens) added to the policy loss
    in the update. None: the model config's `router_aux_loss_coef` (0.001 for Qwen3-MoE); 0: off (the
    `moe/aux_loss` metric is still logged). Dense models ignore it (docs/moe.md)."""

    moe_z_loss_coef: float = 0.0
    """Mixture-of-experts policies: weight of the router z-loss (ST-MoE: mean over non-pad tokens of
    logsumexp(router logits)^2, averaged over layers) added to the policy loss; 0: off (docs/moe.md)."""

    def __post_init__(self) -> None:
        _check_update_sizes(self)
        _check_moe_coefs(self)
        for member in PolicyLoss:  # a built-in name becomes its member; another is checked in validate()
            if self.policy_loss.lower() in (member.value, member.name.lower()):
                object.__setattr__(self, "policy_loss", member)
        require(self.clip_ratio_low >= 0, "clip_ratio_low", "must be >= 0")
        require(self.clip_ratio_high >= 0, "clip_ratio_high", "must be >= 0")
        require(
            self.dual_clip_c == 0.0 or self.dual_clip_c > 1.0,
            "dual_clip_c",
            f"must be 0 (off) or > 1, got {self.dual_clip_c}",
            "use 3.0 as in the dual-clip paper, or 0 to disable",
        )
        require(self.kl_loss_coef >= 0, "kl_loss_coef", "must be >= 0")
        require(
            self.kl_loss_type != KLPenalty.FULL,
            "kl_loss_type",
            "'full' needs full-vocabulary log-probs, which quartet does not carry (verl 0.9.1 raises "
            "NotImplementedError for it too)",
            "use 'low_var_kl' (k3, verl's default for the KL loss) or 'k3+'",
        )
        require(self.loss_agg_norm_constant >= 0, "loss_agg_norm_constant", "must be >= 0")
        require(self.entropy_chunk_size > 0, "entropy_chunk_size", "must be > 0")
        require(
            self.tis_cap >= 0, "tis_cap", "must be >= 0", "use 0 to disable truncated importance sampling"
        )
        require(
            0 <= self.tis_mask_low < max(self.tis_cap, 1.0),
            "tis_mask_low",
            f"must lie in [0, tis_cap), got {self.tis_mask_low}",
        )


@dataclass(frozen=True)
class CriticConfig:
    """The value model (used by GAE only)."""

    model_path: str = ""
    """Folder of the value model or of a causal LM to start it from. Empty: start from the policy model."""

    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer of the critic."""

    mini_batch_size: int = 4
    """Prompts per optimizer step, global (times `rollout.n` responses); divides `data.train_batch_size`."""

    micro_batch_size_per_device: int = 8
    """Responses per forward/backward on one device (per device)."""

    use_dynamic_batch: bool = False
    """Pack micro-batches by `max_tokens_per_micro_batch` instead of `micro_batch_size_per_device`."""

    max_tokens_per_micro_batch: int = 4096
    """Token budget (prompt + response) of one micro-batch on one device, with `use_dynamic_batch`."""

    epochs: int = 1
    """Passes over each step's batch."""

    cliprange_value: float = 0.5
    """Clip of the new value around the old one in the value loss."""

    loss_agg_mode: LossAggMode = LossAggMode.TOKEN_MEAN
    """Reduction of per-token value losses to a scalar."""

    values: MicroBatching = field(default_factory=MicroBatching)
    """Micro-batching of the value pass (no gradient) before advantages."""

    mixed_precision: Dtype = Dtype.AUTO
    """Autocast dtype of forward/backward (float32 turns autocast off; `auto` as `actor.mixed_precision`)."""

    param_offload: bool = False
    """Keep parameters in host memory between uses (GPU only; no-op on CPU)."""

    optimizer_offload: bool = False
    """Keep optimizer states in host memory between updates (GPU only; no-op on CPU)."""

    sequence_parallel_size: int = 1
    """Ulysses sequence parallelism of the critic's value pass and update (docs/parallelism.md): groups of
    this many consecutive devices of the critic's pool split every micro-batch by tokens (run packed), and
    gather the per-token values, so the value loss is the same as without it. 1: off. Must divide the
    critic pool's devices (`cluster.world_size`) and the model's attention heads. Separate from
    `model.sequence_parallel_size` as in verl (`critic.ulysses_sequence_parallel_size`)."""

    moe_aux_loss_coef: float | None = None
    """Mixture-of-experts critics (a value head on an MoE trunk): weight of the router's load-balancing
    loss added to the value loss, as `actor.moe_aux_loss_coef` for the policy; None: the model config's
    `router_aux_loss_coef`; 0: off. Its metrics are `critic/moe/*` (docs/moe.md)."""

    moe_z_loss_coef: float = 0.0
    """Mixture-of-experts critics: weight of the router z-loss added to the value loss; 0: off."""

    def __post_init__(self) -> None:
        _check_update_sizes(self)
        _check_moe_coefs(self)
        require(self.cliprange_value > 0, "cliprange_value", "must be > 0")
        sp = self.sequence_parallel_size
        require(sp >= 1, "sequence_parallel_size", f"must be >= 1, got {sp}", "use 1 to turn it off")


@dataclass(frozen=True)
class ReferenceConfig:
    """The frozen reference policy (needed for any KL term)."""

    logprobs: MicroBatching = field(default_factory=MicroBatching)
    """Micro-batching of the reference log-prob pass."""

    param_offload: bool = False
    """Keep the reference's parameters in host memory between uses (GPU only; no-op on CPU)."""


@dataclass(frozen=True)
class TeacherConfig:
    """The frozen teacher of on-policy distillation (docs/distillation.md): it scores every token the
    student samples; `algorithm.distill_coef` turns its per-token reverse KL into advantages."""

    model_path: str = ""
    """A local Hugging Face folder: another size or architecture than the policy, with the SAME tokenizer
    (checked before any worker starts). Empty: no teacher role."""

    logprobs: MicroBatching = field(default_factory=MicroBatching)
    """Micro-batching of the teacher's log-prob pass."""

    param_offload: bool = False
    """Keep the teacher's parameters in host memory between uses (GPU only; no-op on CPU)."""

    url: str = ""
    """A remote teacher instead: the base URL (`http://host:port/v1`) of an OpenAI-compatible server that
    answers `/v1/completions` with vLLM's `prompt_logprobs` (vLLM's own, or quartet's). The driver sends it
    each row's prompt + response ids (`quartet.roles.remote_teacher`); no teacher role starts. Exclusive
    with `model_path`."""

    model_name: str = ""
    """The `model` of the remote teacher's requests (the name its server serves)."""

    api_key: str = ""
    """Bearer token of the remote teacher's server; empty: none sent."""

    timeout_s: float = 600.0
    """Longest wait for one row's answer from the remote teacher."""

    max_concurrency: int = 8
    """Rows in flight at once to the remote teacher."""

    tokenizer_path: str = ""
    """A local folder with the remote teacher's tokenizer (required with `url`): checked against the
    policy's before any worker starts, as `model_path` is."""

    def __post_init__(self) -> None:
        require(
            not self.url or self.url.startswith(("http://", "https://")),
            "url",
            f"must be an http(s) URL (http://host:port/v1), got '{self.url}'",
        )
        require(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
        require(self.max_concurrency >= 1, "max_concurrency", f"must be >= 1, got {self.max_concurrency}")

    @property
    def enabled(self) -> bool:
        """A teacher scores the sampled tokens: a local role or a remote server."""
        return bool(self.model_path or self.url)

    @property
    def local(self) -> bool:
        """The teacher is a role of its own (`model_path`)."""
        return bool(self.model_path)
