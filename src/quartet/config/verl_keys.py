"""The verl -> quartet key table used by `quartet.config.from_verl`.

Written from verl's documented config (`ppo_trainer.yaml`, its config explanation page), not copied. Each
mapped key names its quartet field, a conversion when the meaning differs (`how` says what it does), a note.
Keys quartet has no equivalent for are listed with the reason in `quartet.config.verl_unmapped`: a
translation names every key it drops.

Units, checked against both sides' docs:
- `data.train_batch_size` and `ppo_mini_batch_size` count PROMPTS in verl (verl multiplies the mini-batch by
  `rollout.n` internally); quartet's `data.train_batch_size` and `<role>.mini_batch_size` too: copied.
- `*_micro_batch_size_per_gpu` counts RESPONSES per device in verl, as quartet's
  `micro_batch_size_per_device` does: copied. The deprecated global `*_micro_batch_size` is divided by the
  data-parallel size, `trainer.n_gpus_per_node` x `trainer.nnodes` / (sp x tp), as verl itself does (its
  data-parallel size is the world over the Ulysses group; a sequence group pools its rows in both).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AR", "RULES", "VERL_DEFAULTS", "Context", "Rule", "Skip"]


@dataclass(frozen=True)
class Context:
    """What a conversion may read besides its own value: the whole verl key set (after verl's defaults)."""

    values: Mapping[str, Any]

    @property
    def world_size(self) -> int:
        gpus = self.values.get("trainer.n_gpus_per_node", 8)
        nodes = self.values.get("trainer.nnodes", 1)
        return int(gpus) * int(nodes)

    def group_size(self, role: str) -> tuple[int, int]:
        """(sp, tp) of a role's engine as the translation sets them: `actor` (also the reference's and the
        log-prob passes, which share the policy's sizes), `critic` (its own sp, no tp), `reward` (neither)."""
        if role == "critic":
            return self._size("critic.ulysses_sequence_parallel_size"), 1
        if role != "actor":
            return 1, 1
        sp_key, tp_key = "ulysses_sequence_parallel_size", "megatron.tensor_model_parallel_size"
        sp = self._size(f"{AR}.actor.{sp_key}", f"{AR}.ref.{sp_key}")
        return sp, self._size(f"{AR}.actor.{tp_key}", f"{AR}.ref.{tp_key}")

    def _size(self, *keys: str) -> int:
        for key in keys:
            if self.values.get(key) is not None:
                return max(int(self.values[key]), 1)
        return 1


class Skip(Exception):
    """Raised by a conversion whose value has no quartet equivalent; the message is the reason."""


Convert = Callable[[Any, Context], Any]


@dataclass(frozen=True)
class Rule:
    """One verl key: the quartet field it lands in, how its value is converted (None: copied), a note."""

    target: str
    convert: Convert | None = None
    how: str = ""
    note: str = ""
    also: tuple[str, ...] = ()  # more quartet fields that take the same converted value
    fallback: bool = False  # yields to any other verl key that sets the same quartet field
    value_note: bool = True
    """`how` describes a value mapping (`-1 (never) -> 0 (never)`), reported only when it changed the
    value; False: it describes the key's meaning (`GPUs per node -> bundles per node`), reported always."""

    @property
    def takes_null(self) -> bool:
        """Whether `null` has a meaning this rule converts (else null means "unset in verl")."""
        return self.convert in (_null_zero, _null_zero_ratio, _reward_fn)


def _per_dp(role: str) -> Convert:
    """verl's deprecated global micro-batch of `role` -> rows per data-parallel rank (see the docstring)."""

    def convert(value: Any, ctx: Context) -> int:
        world = ctx.world_size
        sp, tp = ctx.group_size(role)
        if world % (sp * tp):
            raise Skip(f"sp {sp} x tp {tp} does not divide the {world} GPUs (n_gpus_per_node x nnodes)")
        dp = world // (sp * tp)
        if int(value) % dp:
            where = f"{world} GPUs" if dp == world else f"dp {dp} = {world} GPUs / (sp {sp} x tp {tp})"
            raise Skip(f"{value} responses do not split evenly over the data-parallel ranks ({where})")
        return int(value) // dp

    return convert


def _freq(value: Any, ctx: Context) -> int:
    return max(int(value), 0)


def _null_zero(value: Any, ctx: Context) -> int:
    return 0 if value is None else int(value)


def _null_zero_ratio(value: Any, ctx: Context) -> float:
    return 0.0 if value is None else float(value)  # a ratio: int() would turn 0.1 into 0


def _not(value: Any, ctx: Context) -> bool:
    if isinstance(value, str):  # a command-line override arrives as text
        value = value.strip().lower() in ("true", "1", "yes")
    return not bool(value)


def _top_k(value: Any, ctx: Context) -> int:
    return max(int(value), 0)


def _engine(value: Any, ctx: Context) -> str:
    engines = {"vllm": "vllm", "hf": "torch"}
    if str(value) not in engines:
        raise Skip(f"rollout engine '{value}' is not built into quartet (it has vllm and torch)")
    return engines[str(value)]


def _device(value: Any, ctx: Context) -> str:
    devices = {"cuda": "gpu", "cpu": "cpu"}
    if str(value) not in devices:
        raise Skip(f"device '{value}' is not supported by quartet (cuda or cpu)")
    return devices[str(value)]


def _gpus(value: Any, ctx: Context) -> int:
    return int(value)


def _loggers(value: Any, ctx: Context) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    known = {"console", "wandb", "tensorboard", "mlflow"}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise Skip(f"logger(s) {unknown} have no quartet sink (it has {sorted(known)} and jsonl)")
    return [*names, "jsonl"] if "jsonl" not in names else names


def _files(value: Any, ctx: Context) -> list[str]:
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def _reward_fn(value: Any, ctx: Context) -> str:
    if not value:
        return ""
    name = ctx.values.get("custom_reward_function.name") or "compute_score"
    return f"{value}:{name}"


def _adv(value: Any, ctx: Context) -> str:
    names = {"grpo_passk": ""}
    if str(value) in names:
        raise Skip(f"estimator '{value}' is not built into quartet (register one with @register_estimator)")
    return str(value)


def _policy_loss(value: Any, ctx: Context) -> str:
    names = {"vanilla": "ppo", "gspo": "gspo"}
    if str(value) not in names:
        raise Skip(
            f"policy loss '{value}' is not built into quartet (register it with @register_policy_loss)"
        )
    return names[str(value)]


def _resume(value: Any, ctx: Context) -> str:
    if value == "resume_path":
        path = ctx.values.get("trainer.resume_from_path")
        if not path:
            raise Skip("resume_mode=resume_path without trainer.resume_from_path")
        return str(path)
    modes = {"auto": "auto", "disable": "off"}
    if str(value) not in modes:
        raise Skip(f"resume mode '{value}' is unknown")
    return modes[str(value)]


def _do_sample(value: Any, ctx: Context) -> float:
    if value:
        raise Skip("do_sample=True keeps rollout.val.temperature as given (see val_kwargs.temperature)")
    return 0.0


def _truncation(value: Any, ctx: Context) -> str:
    if ctx.values.get("data.filter_overlong_prompts"):
        raise Skip("overridden by data.filter_overlong_prompts=True (verl filters at load time)")
    modes = {"error": "error", "left": "truncate"}
    if str(value) not in modes:
        raise Skip(f"truncation '{value}' has no quartet mode (it keeps the prompt's end: verl's 'left')")
    return modes[str(value)]


def _filter(value: Any, ctx: Context) -> str:
    if not value:
        raise Skip("False: the prompt rule comes from data.truncation")
    return "filter"


def _tool_format(value: Any, ctx: Context) -> str:
    if str(value) != "hermes":
        raise Skip(f"tool-call format '{value}' is not built in; quartet writes tool calls as hermes")
    return "hermes"


def _interface(value: Any, ctx: Context) -> str:
    interfaces = {"sync": "batch", "async": "server"}
    if str(value) not in interfaces:
        raise Skip(f"rollout mode '{value}' is unknown (verl has sync and async)")
    return interfaces[str(value)]


def _agent_loop(value: Any, ctx: Context) -> str:
    loops = {"single_turn_agent": "single_turn", "tool_agent": "tool_agent"}
    if str(value) not in loops:
        raise Skip(
            f"agent loop '{value}' is not built in (quartet has single_turn, tool_agent, user_sim); port it "
            "with @register_agent_loop (docs/custom_algorithms.md) and set rollout.multi_turn.default_agent"
        )
    return loops[str(value)]


def _lora_targets(value: Any, ctx: Context) -> list[str]:
    if isinstance(value, str):
        raise Skip(f"'{value}' is a verl shorthand; quartet needs module names (model.lora.target_modules)")
    return [str(v) for v in value]


AR = "actor_rollout_ref"
"""The prefix of verl's actor, rollout and reference keys."""
_COPY = "copied (same unit)"
_MOE_AUX = (
    "the router's load-balancing loss; Megatron adds it per layer, quartet pools the layers (docs/moe.md)"
)
_MOE_Z = "the router z-loss; Megatron adds it per layer, quartet averages the layers (docs/moe.md)"
_PER_DEV = (
    "divided by the data-parallel size, n_gpus_per_node x nnodes / (sp x tp) "
    "(verl's deprecated global count -> per data-parallel rank)"
)

RULES: dict[str, Rule] = {
    # data
    "data.train_files": Rule("data.train_files", _files, "a single path becomes a list"),
    "data.val_files": Rule("data.val_files", _files, "a single path becomes a list"),
    "data.train_batch_size": Rule("data.train_batch_size", note="prompts per step in both"),
    "data.val_batch_size": Rule("data.val_batch_size", note="prompts per validation call"),
    "data.max_prompt_length": Rule("data.max_prompt_length", note="tokens"),
    "data.max_response_length": Rule("data.max_response_length", note="tokens"),
    "data.prompt_key": Rule("data.prompt_key"),
    "data.image_key": Rule("data.image_key", note="column of each row's images (docs/vision.md)"),
    "data.reward_fn_key": Rule("data.data_source_key", note="column that selects the scorer"),
    "data.shuffle": Rule("data.shuffle"),
    "data.seed": Rule("data.seed"),
    "data.filter_overlong_prompts": Rule("data.overlong_prompt", _filter, "True -> filter"),
    "data.truncation": Rule("data.overlong_prompt", _truncation, "error -> error, left -> truncate"),
    # model
    f"{AR}.model.path": Rule("model.path", note="must be a local folder: quartet downloads nothing"),
    f"{AR}.model.tokenizer_path": Rule("model.tokenizer_path"),
    f"{AR}.model.enable_gradient_checkpointing": Rule("model.gradient_checkpointing"),
    f"{AR}.model.use_remove_padding": Rule("model.remove_padding", note="packed micro-batches"),
    f"{AR}.actor.ulysses_sequence_parallel_size": Rule(
        "model.sequence_parallel_size", note="Ulysses sequence parallelism of the policy's passes"
    ),
    f"{AR}.ref.ulysses_sequence_parallel_size": Rule(
        "model.sequence_parallel_size", note="the reference shares the actor's", fallback=True
    ),
    f"{AR}.actor.megatron.tensor_model_parallel_size": Rule("model.tensor_parallel_size", note="DTensor TP"),
    f"{AR}.ref.megatron.tensor_model_parallel_size": Rule("model.tensor_parallel_size", fallback=True),
    f"{AR}.actor.megatron.expert_model_parallel_size": Rule(
        "model.expert_parallel_size", note="experts split over devices (docs/moe_expert_parallel.md)"
    ),
    f"{AR}.ref.megatron.expert_model_parallel_size": Rule(
        "model.expert_parallel_size", note="the reference shares the actor's", fallback=True
    ),
    f"{AR}.actor.megatron.override_transformer_config.moe_aux_loss_coeff": Rule(
        "actor.moe_aux_loss_coef", note=_MOE_AUX
    ),
    f"{AR}.actor.megatron.override_transformer_config.moe_z_loss_coeff": Rule(
        "actor.moe_z_loss_coef", note=_MOE_Z
    ),
    "critic.megatron.override_transformer_config.moe_aux_loss_coeff": Rule(
        "critic.moe_aux_loss_coef", note=_MOE_AUX
    ),
    "critic.megatron.override_transformer_config.moe_z_loss_coeff": Rule(
        "critic.moe_z_loss_coef", note=_MOE_Z
    ),
    f"{AR}.model.use_fused_kernels": Rule(
        "model.fused_head", note="log-probs from hidden states in vocabulary blocks (engines/fused_head)"
    ),
    f"{AR}.actor.freeze_vision_tower": Rule("model.freeze_vision_tower", note="docs/vision.md"),
    f"{AR}.model.lora_rank": Rule("model.lora.rank"),
    f"{AR}.model.lora_alpha": Rule("model.lora.alpha"),
    f"{AR}.model.target_modules": Rule("model.lora.target_modules", _lora_targets, "list copied"),
    # actor
    f"{AR}.actor.optim.lr": Rule("actor.optim.lr"),
    f"{AR}.actor.optim.weight_decay": Rule("actor.optim.weight_decay"),
    f"{AR}.actor.optim.betas": Rule("actor.optim.betas"),
    f"{AR}.actor.optim.lr_warmup_steps": Rule("actor.optim.warmup_steps", _freq, "-1 (use the ratio) -> 0"),
    f"{AR}.actor.optim.min_lr_ratio": Rule("actor.optim.min_lr_ratio", _null_zero_ratio, "null -> 0"),
    f"{AR}.actor.optim.warmup_style": Rule("actor.optim.schedule"),
    f"{AR}.actor.optim.lr_scheduler_type": Rule("actor.optim.schedule"),
    f"{AR}.actor.grad_clip": Rule("actor.optim.grad_clip"),
    f"{AR}.actor.ppo_mini_batch_size": Rule("actor.mini_batch_size", note="prompts in both (x rollout.n)"),
    f"{AR}.actor.ppo_micro_batch_size_per_gpu": Rule(
        "actor.micro_batch_size_per_device", note="responses per device in both"
    ),
    f"{AR}.actor.ppo_micro_batch_size": Rule("actor.micro_batch_size_per_device", _per_dp("actor"), _PER_DEV),
    f"{AR}.actor.use_dynamic_bsz": Rule("actor.use_dynamic_batch"),
    f"{AR}.actor.ppo_max_token_len_per_gpu": Rule("actor.max_tokens_per_micro_batch", note="per device"),
    f"{AR}.actor.ppo_epochs": Rule("actor.epochs"),
    f"{AR}.actor.shuffle": Rule("actor.shuffle"),
    f"{AR}.actor.clip_ratio": Rule(
        "actor.clip_ratio_low",
        how="copied to both clip_ratio_low and _high unless those are given",
        also=("actor.clip_ratio_high",),
        fallback=True,
        value_note=False,
    ),
    f"{AR}.actor.clip_ratio_low": Rule("actor.clip_ratio_low"),
    f"{AR}.actor.clip_ratio_high": Rule("actor.clip_ratio_high"),
    f"{AR}.actor.clip_ratio_c": Rule("actor.dual_clip_c", note="verl's default 3.0 is applied when unset"),
    f"{AR}.actor.loss_agg_mode": Rule("actor.loss_agg_mode"),
    f"{AR}.actor.policy_loss.loss_mode": Rule("actor.policy_loss", _policy_loss, "vanilla -> ppo"),
    f"{AR}.actor.entropy_coeff": Rule("actor.entropy_coeff"),
    f"{AR}.actor.use_kl_loss": Rule("actor.use_kl_loss"),
    f"{AR}.actor.kl_loss_coef": Rule("actor.kl_loss_coef"),
    f"{AR}.actor.kl_loss_type": Rule("actor.kl_loss_type", note="verl's KL names load unchanged"),
    f"{AR}.actor.fsdp_config.param_offload": Rule("actor.param_offload"),
    f"{AR}.actor.fsdp_config.optimizer_offload": Rule("actor.optimizer_offload"),
    # rollout
    f"{AR}.rollout.name": Rule("rollout.engine", _engine, "vllm -> vllm, hf -> torch"),
    f"{AR}.rollout.mode": Rule("rollout.interface", _interface, "sync -> batch, async -> server"),
    f"{AR}.rollout.n": Rule("rollout.n", note="responses per prompt"),
    f"{AR}.rollout.temperature": Rule("rollout.temperature"),
    f"{AR}.rollout.top_p": Rule("rollout.top_p"),
    f"{AR}.rollout.top_k": Rule("rollout.top_k", _top_k, "-1 (off) -> 0 (off)"),
    f"{AR}.rollout.seed": Rule("rollout.seed"),
    f"{AR}.rollout.dtype": Rule("rollout.dtype"),
    f"{AR}.rollout.gpu_memory_utilization": Rule("rollout.gpu_memory_utilization"),
    f"{AR}.rollout.tensor_model_parallel_size": Rule("rollout.tensor_parallel_size"),
    f"{AR}.rollout.max_num_seqs": Rule("rollout.max_num_seqs", note="per replica"),
    f"{AR}.rollout.free_cache_engine": Rule("rollout.sleep_while_training"),
    f"{AR}.rollout.enforce_eager": Rule(
        "rollout.cuda_graphs",
        _not,
        "negated",
        note="the built-in engine's CUDA graphs; the vLLM engine runs eager",
    ),
    f"{AR}.rollout.log_prob_micro_batch_size_per_gpu": Rule(
        "actor.logprobs.micro_batch_size_per_device", note="responses per device in both"
    ),
    f"{AR}.rollout.log_prob_micro_batch_size": Rule(
        "actor.logprobs.micro_batch_size_per_device", _per_dp("actor"), _PER_DEV
    ),
    f"{AR}.rollout.log_prob_use_dynamic_bsz": Rule("actor.logprobs.use_dynamic_batch"),
    f"{AR}.rollout.log_prob_max_token_len_per_gpu": Rule("actor.logprobs.max_tokens_per_micro_batch"),
    f"{AR}.rollout.val_kwargs.temperature": Rule("rollout.val.temperature"),
    f"{AR}.rollout.val_kwargs.top_p": Rule("rollout.val.top_p"),
    f"{AR}.rollout.val_kwargs.top_k": Rule("rollout.val.top_k", _top_k, "-1 (off) -> 0 (off)"),
    f"{AR}.rollout.val_kwargs.n": Rule("rollout.val.n"),
    f"{AR}.rollout.val_kwargs.do_sample": Rule("rollout.val.temperature", _do_sample, "False -> 0 (greedy)"),
    f"{AR}.rollout.multi_turn.enable": Rule("rollout.multi_turn.enable"),
    f"{AR}.rollout.multi_turn.max_assistant_turns": Rule("rollout.multi_turn.max_assistant_turns"),
    f"{AR}.rollout.multi_turn.max_user_turns": Rule("rollout.multi_turn.max_user_turns"),
    f"{AR}.rollout.multi_turn.tool_config_path": Rule("rollout.multi_turn.tool_config_path"),
    f"{AR}.rollout.multi_turn.interaction_config_path": Rule("rollout.multi_turn.interaction_config_path"),
    f"{AR}.rollout.multi_turn.max_tool_response_length": Rule(
        "rollout.multi_turn.max_tool_response_length", note="characters in both"
    ),
    f"{AR}.rollout.agent.default_agent_loop": Rule(
        "rollout.multi_turn.default_agent", _agent_loop, "single_turn_agent -> single_turn, tool_agent kept"
    ),
    f"{AR}.rollout.multi_turn.format": Rule(
        "rollout.multi_turn.tool_call_format", _tool_format, "hermes only"
    ),
    # reference
    f"{AR}.ref.log_prob_micro_batch_size_per_gpu": Rule("reference.logprobs.micro_batch_size_per_device"),
    f"{AR}.ref.log_prob_micro_batch_size": Rule(
        "reference.logprobs.micro_batch_size_per_device", _per_dp("actor"), _PER_DEV
    ),
    f"{AR}.ref.log_prob_use_dynamic_bsz": Rule("reference.logprobs.use_dynamic_batch"),
    f"{AR}.ref.log_prob_max_token_len_per_gpu": Rule("reference.logprobs.max_tokens_per_micro_batch"),
    f"{AR}.ref.fsdp_config.param_offload": Rule("reference.param_offload"),
    # critic
    "critic.model.path": Rule("critic.model_path", note="must be a local folder"),
    "critic.optim.lr": Rule("critic.optim.lr"),
    "critic.optim.weight_decay": Rule("critic.optim.weight_decay"),
    "critic.optim.betas": Rule("critic.optim.betas"),
    "critic.optim.lr_warmup_steps": Rule("critic.optim.warmup_steps", _freq, "-1 (use the ratio) -> 0"),
    "critic.grad_clip": Rule("critic.optim.grad_clip"),
    "critic.ppo_mini_batch_size": Rule(
        "critic.mini_batch_size", note="prompts; unset: the actor's (as verl)"
    ),
    "critic.ppo_micro_batch_size_per_gpu": Rule("critic.micro_batch_size_per_device", note="per device"),
    "critic.ppo_micro_batch_size": Rule("critic.micro_batch_size_per_device", _per_dp("critic"), _PER_DEV),
    "critic.forward_micro_batch_size_per_gpu": Rule("critic.values.micro_batch_size_per_device"),
    "critic.forward_micro_batch_size": Rule(
        "critic.values.micro_batch_size_per_device", _per_dp("critic"), _PER_DEV
    ),
    "critic.forward_max_token_len_per_gpu": Rule("critic.values.max_tokens_per_micro_batch"),
    "critic.use_dynamic_bsz": Rule("critic.use_dynamic_batch"),
    "critic.ppo_max_token_len_per_gpu": Rule("critic.max_tokens_per_micro_batch"),
    "critic.ppo_epochs": Rule("critic.epochs", note="unset: the actor's (as verl)"),
    "critic.cliprange_value": Rule("critic.cliprange_value"),
    "critic.loss_agg_mode": Rule("critic.loss_agg_mode"),
    "critic.ulysses_sequence_parallel_size": Rule("critic.sequence_parallel_size"),
    "critic.model.fsdp_config.param_offload": Rule("critic.param_offload"),
    "critic.model.fsdp_config.optimizer_offload": Rule("critic.optimizer_offload"),
    # reward
    "reward_model.model.path": Rule("reward.model_path"),
    "reward_model.micro_batch_size_per_gpu": Rule("reward.micro_batch_size_per_device"),
    "reward_model.micro_batch_size": Rule("reward.micro_batch_size_per_device", _per_dp("reward"), _PER_DEV),
    "custom_reward_function.path": Rule("reward.function", _reward_fn, "path + name -> 'path:name'"),
    # algorithm
    "algorithm.adv_estimator": Rule("algorithm.adv_estimator", _adv, note="verl's default gae when unset"),
    "algorithm.gamma": Rule("algorithm.gamma"),
    "algorithm.lam": Rule("algorithm.lam"),
    "algorithm.norm_adv_by_std_in_grpo": Rule("algorithm.norm_adv_by_std"),
    "algorithm.use_kl_in_reward": Rule("algorithm.use_kl_in_reward"),
    "algorithm.kl_penalty": Rule("algorithm.kl_penalty"),
    "algorithm.kl_ctrl.type": Rule("algorithm.kl_ctrl.kind"),
    "algorithm.kl_ctrl.kl_coef": Rule("algorithm.kl_ctrl.coef", note="used only with use_kl_in_reward"),
    "algorithm.kl_ctrl.target_kl": Rule("algorithm.kl_ctrl.target_kl"),
    "algorithm.kl_ctrl.horizon": Rule("algorithm.kl_ctrl.horizon"),
    "algorithm.filter_groups.enable": Rule("algorithm.filter_groups"),
    "algorithm.filter_groups.max_num_gen_batches": Rule("algorithm.max_num_gen_batches"),
    # trainer
    "trainer.total_epochs": Rule("trainer.total_epochs", note="epochs in both"),
    "trainer.total_training_steps": Rule("trainer.total_steps", _null_zero, "null -> 0 (use epochs)"),
    "trainer.project_name": Rule("trainer.project_name"),
    "trainer.experiment_name": Rule("trainer.experiment_name"),
    "trainer.logger": Rule("trainer.loggers", _loggers, "list kept, jsonl added (always written)"),
    "trainer.save_freq": Rule("trainer.save_freq", _freq, "-1 (never) -> 0 (quartet still saves at the end)"),
    "trainer.test_freq": Rule("trainer.test_freq", _freq, "-1 (never) -> 0 (never)"),
    "trainer.val_before_train": Rule("trainer.val_before_train"),
    "trainer.critic_warmup": Rule("trainer.critic_warmup"),
    "trainer.max_actor_ckpt_to_keep": Rule("trainer.max_checkpoints_to_keep", _null_zero, "null -> 0 (all)"),
    "trainer.resume_mode": Rule("trainer.resume", _resume, "disable -> off, resume_path -> the path"),
    "trainer.nnodes": Rule("cluster.nodes"),
    "trainer.n_gpus_per_node": Rule(
        "cluster.bundles_per_node", _gpus, "GPUs per node -> bundles per node", value_note=False
    ),
    "trainer.device": Rule("cluster.device", _device, "cuda -> gpu"),
    "ray_init.num_cpus": Rule("cluster.num_cpus", _null_zero, "null -> 0 (Ray detects)"),
}

# verl's defaults where quartet's differ and the difference changes the algorithm or the batch shape: a verl
# command line that does not set them means these values, so they are translated as if given.
VERL_DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    f"{AR}.rollout.n": 1,
    f"{AR}.actor.optim.lr": 1e-6,
    "critic.optim.lr": 1e-5,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    f"{AR}.actor.ppo_mini_batch_size": 256,
    f"{AR}.actor.clip_ratio_c": 3.0,
    "trainer.total_epochs": 30,
    "trainer.test_freq": -1,
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
}
