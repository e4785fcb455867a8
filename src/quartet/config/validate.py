"""Cross-field rules, checked once on the driver before any worker starts.

Local rules (a value's own range) live in each dataclass's `__post_init__`; here are the rules that tie
components together, mostly batch sizes that must divide across the data-parallel world (`validate` for
an RL run, `sft_rules` for `quartet sft`, which reads the `sft` section instead of the roles'):

    responses per step         = data.train_batch_size x rollout.n
    responses per mini-batch   = <role>.mini_batch_size x rollout.n          (global)
    per device per mini-batch  = responses per mini-batch / cluster.world_size
    per group per mini-batch   = responses per mini-batch / dp,   dp = cluster.world_size / (sp x tp)
    micro-batches per update   = per group per mini-batch / <role>.micro_batch_size_per_device

A sequence (or tensor) group pools its ranks' rows and runs them as one set of micro-batches
(docs/parallelism.md, "Micro-batching with SP"), so the micro-batch divides the rows of a data-parallel
group, as verl's `*_micro_batch_size_per_gpu` divides the rows of a data-parallel rank (world / sp).
"""

from __future__ import annotations

from quartet.config.algorithm import unknown_name_fix
from quartet.config.cluster import gpu_share_problems
from quartet.config.errors import ConfigError, raise_problems
from quartet.config.parallel import divisors, head_problems, pool_problems, vision_problem
from quartet.config.roles import ActorConfig, CriticConfig, Role
from quartet.config.root import QuartetConfig
from quartet.config.routing_rules import routing_problems
from quartet.config.shape_rules import shape_rules
from quartet.core.registry import policy_loss_names

__all__ = ["sft_rules", "validate"]


def validate(cfg: QuartetConfig) -> QuartetConfig:
    """Check every cross-field rule; raise one ConfigError listing all violations, else return `cfg`."""
    problems: list[ConfigError] = []
    problems += _update_sizes("actor", cfg.actor, cfg)
    if cfg.algorithm.needs_critic:
        problems += _update_sizes("critic", cfg.critic, cfg)
    problems += _algorithm_rules(cfg)
    problems += _length_rules(cfg)
    problems += _mode_rules(cfg)
    problems += _parallel_rules(cfg)
    if cfg.algorithm.needs_critic:
        problems += _critic_parallel_rules(cfg)
    problems += gpu_share_problems(cfg.cluster)
    problems += routing_problems(cfg)
    problems += shape_rules(cfg)
    problems += cfg.reward.judge.problems("reward.judge")
    raise_problems(problems)
    return cfg


def _update_sizes(role: str, rc: ActorConfig | CriticConfig, cfg: QuartetConfig) -> list[ConfigError]:
    out: list[ConfigError] = []
    prompts = cfg.data.train_batch_size
    n = cfg.rollout.n
    world = cfg.cluster.world_size
    if prompts % rc.mini_batch_size:
        out.append(
            ConfigError(
                f"{role}.mini_batch_size",
                f"{rc.mini_batch_size} prompts does not divide data.train_batch_size={prompts} prompts",
                f"set {role}.mini_batch_size to one of {divisors(prompts)}, or change data.train_batch_size",
            )
        )
        return out
    responses = rc.mini_batch_size * n
    if responses % world:
        out.append(
            ConfigError(
                f"{role}.mini_batch_size",
                f"a mini-batch of {rc.mini_batch_size} prompts x rollout.n={n} = {responses} responses "
                f"cannot be split evenly over cluster.world_size={world} devices",
                f"make {role}.mini_batch_size x rollout.n a multiple of {world}",
            )
        )
        return out
    sp, tp = _row_group(role, cfg)
    if world % (sp * tp) == 0:  # else _parallel_rules names the sizes
        out += _micro_rule(role, rc, n, world, sp, tp)
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    if rc.use_dynamic_batch and rc.max_tokens_per_micro_batch < longest:
        out.append(
            ConfigError(
                f"{role}.max_tokens_per_micro_batch",
                f"{rc.max_tokens_per_micro_batch} tokens cannot hold one sequence of up to {longest} tokens "
                "(data.max_prompt_length + data.max_response_length)",
                f"set {role}.max_tokens_per_micro_batch >= {longest}",
            )
        )
    return out


def _row_group(role: str, cfg: QuartetConfig) -> tuple[int, int]:
    """(sp, tp) of the role's engine: the ranks that pool their rows (`engines.ulysses.group_rows`)."""
    if role == "critic":
        return cfg.critic.sequence_parallel_size, 1
    return cfg.model.sequence_parallel_size, cfg.model.tensor_parallel_size


def _micro_rule(
    role: str, rc: ActorConfig | CriticConfig, n: int, world: int, sp: int, tp: int
) -> list[ConfigError]:
    """The micro-batch against the rows one data-parallel group runs per mini-batch (see the docstring)."""
    dp = world // (sp * tp)
    per_group = rc.mini_batch_size * n // dp
    micro = rc.micro_batch_size_per_device
    if rc.use_dynamic_batch or per_group % micro == 0:
        return []
    if sp * tp == 1:
        where = f"each device gets per mini-batch ({rc.mini_batch_size} prompts x {n} / {world} devices)"
    else:
        where = (
            f"each data-parallel group gets per mini-batch ({rc.mini_batch_size} prompts x {n} / dp {dp}; "
            f"dp = {world} devices / (sp {sp} x tp {tp}), a group's ranks pool their rows)"
        )
    return [
        ConfigError(
            f"{role}.micro_batch_size_per_device",
            f"{micro} responses does not divide the {per_group} responses {where}",
            f"set {role}.micro_batch_size_per_device to one of {divisors(per_group)}, "
            f"or set {role}.use_dynamic_batch=true",
        )
    ]


def _parallel_rules(cfg: QuartetConfig) -> list[ConfigError]:
    model = cfg.model
    pool = "the policy's pool (cluster.world_size)"
    problems = pool_problems(
        model.sequence_parallel_size,
        model.tensor_parallel_size,
        cfg.cluster.world_size,
        pool,
        ep=model.expert_parallel_size,
    )
    return [p.under("model") for p in problems]


def _critic_parallel_rules(cfg: QuartetConfig) -> list[ConfigError]:
    """The critic's sequence groups: within its pool (the main pool's shape, `cluster.world_size` devices),
    and over the tiny policy's heads when the critic starts from it."""
    sp = cfg.critic.sequence_parallel_size
    pool = "the critic's pool (cluster.world_size)"
    problems = pool_problems(sp, 1, cfg.cluster.world_size, pool, section="critic")
    if not problems and not cfg.critic.model_path and cfg.model.is_tiny:
        tiny = cfg.model.tiny
        note = "the critic starts from the tiny model"
        vision = vision_problem(sp, "critic", note) if tiny.arch.is_vision else None
        heads = head_problems(
            tiny.num_attention_heads, tiny.num_key_value_heads, sp, 1, "the tiny model's", note
        )
        problems = [vision] if vision else heads
    return [p.under("critic") for p in problems[:1]]


def _gkd_rules(cfg: QuartetConfig) -> list[ConfigError]:
    """GKD needs a local teacher's top-k and the student's log-probs there: the padded, unsplit head."""
    if cfg.algorithm.gkd_coef <= 0:
        return []
    coef = f"is {cfg.algorithm.gkd_coef:g}"
    if not cfg.teacher.enabled:
        return [
            ConfigError(
                "algorithm.gkd_coef",
                f"{coef}, but there is no teacher: GKD reads a teacher's top-k log-probs at every position",
                "set teacher.model_path to the teacher's folder (same tokenizer) or teacher.url to a "
                "server's, or algorithm.gkd_coef=0",
            )
        ]
    m = cfg.model
    unbuilt = [
        f"{key}={value}"
        for key, value, fine in (
            ("model.remove_padding", m.remove_padding, not m.remove_padding),
            ("model.sequence_parallel_size", m.sequence_parallel_size, m.sequence_parallel_size == 1),
            ("model.tensor_parallel_size", m.tensor_parallel_size, m.tensor_parallel_size == 1),
        )
        if not fine
    ]
    if not unbuilt:
        return []
    return [
        ConfigError(
            "algorithm.gkd_coef",
            f"{coef} with {', '.join(unbuilt)}: top-k and support log-probs are built for the padded, "
            "unsplit head only (not for packed passes or a vocabulary-parallel head)",
            "set model.remove_padding=false and sequence/tensor parallel sizes 1, or algorithm.gkd_coef=0",
        )
    ]


def _remote_teacher_rules(cfg: QuartetConfig) -> list[ConfigError]:
    """A remote teacher (`teacher.url`) scores at temperature 1 and starts no role, so no pool of its own."""
    t = cfg.teacher
    if not t.url:
        return []
    if t.model_path:
        return [
            ConfigError(
                "teacher.url",
                f"a remote teacher (teacher.url={t.url}) and a local one (teacher.model_path={t.model_path}) "
                "are both set",
                "keep one: teacher.url or teacher.model_path",
            )
        ]
    out: list[ConfigError] = []
    if not t.tokenizer_path:
        out.append(
            ConfigError(
                "teacher.tokenizer_path",
                "is empty, but a remote teacher (teacher.url) scores the policy's token ids: its tokenizer "
                "must be checked against the policy's before any worker starts",
                "set teacher.tokenizer_path to a local folder with the teacher's tokenizer",
            )
        )
    if cfg.rollout.temperature not in (0.0, 1.0):
        out.append(
            ConfigError(
                "teacher.url",
                f"a remote teacher's log-probs are the raw model's (temperature 1: vLLM's prompt_logprobs), "
                f"but rollout.temperature={cfg.rollout.temperature:g} samples the student at another one, "
                "so the reverse KL would compare two temperatures",
                "set rollout.temperature=1, or use a local teacher (teacher.model_path), which scores at the "
                "rollout's temperature",
            )
        )
    if Role.TEACHER in cfg.cluster.separate_pools:
        out.append(
            ConfigError(
                "cluster.separate_pools",
                f"lists teacher, but the teacher is remote (teacher.url={cfg.teacher.url}): no teacher "
                "role starts",
                "drop teacher from cluster.separate_pools",
            )
        )
    return out


def _algorithm_rules(cfg: QuartetConfig) -> list[ConfigError]:
    out: list[ConfigError] = []
    est = cfg.algorithm.adv_estimator
    builtin_losses, registered_losses = policy_loss_names()
    loss = cfg.actor.policy_loss
    if loss not in builtin_losses + registered_losses:
        out.append(
            ConfigError(
                "actor.policy_loss",
                f"'{loss}' is neither a built-in nor a registered policy loss",
                unknown_name_fix(loss, builtin_losses, registered_losses, "register_policy_loss"),
            )
        )
    if cfg.algorithm.distill_coef > 0 and not cfg.teacher.enabled:
        out.append(
            ConfigError(
                "algorithm.distill_coef",
                f"is {cfg.algorithm.distill_coef:g}, but there is no teacher to distil from",
                "set teacher.model_path to the teacher's folder (same tokenizer as the policy), or "
                "teacher.url to a server's, or algorithm.distill_coef=0",
            )
        )
    out += _remote_teacher_rules(cfg)
    out += _gkd_rules(cfg)
    if cfg.algorithm.needs_group and cfg.rollout.n < 2:
        out.append(
            ConfigError(
                "rollout.n",
                f"algorithm.adv_estimator={est} compares the samples of one prompt, "
                f"but rollout.n={cfg.rollout.n} gives groups of one (every advantage would be 0)",
                "set rollout.n >= 2 (4 to 16 is usual), or use algorithm.adv_estimator=reinforce_plus_plus",
            )
        )
    if cfg.actor.use_kl_loss and cfg.algorithm.use_kl_in_reward:
        out.append(
            ConfigError(
                "actor.use_kl_loss",
                "KL is applied twice: as a loss term and in the reward (algorithm.use_kl_in_reward)",
                "keep one: actor.use_kl_loss=false or algorithm.use_kl_in_reward=false",
            )
        )
    if cfg.algorithm.turn_reward_coef > 0 and not cfg.rollout.multi_turn.enable:
        out.append(
            ConfigError(
                "algorithm.turn_reward_coef",
                "turn rewards come from multi-turn agent loops (tools, simulated users), which are off",
                "set rollout.multi_turn.enable=true, or algorithm.turn_reward_coef=0",
            )
        )
    return out


def _length_rules(cfg: QuartetConfig) -> list[ConfigError]:
    out: list[ConfigError] = []
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    if cfg.reward.overlong_buffer >= cfg.data.max_response_length:
        out.append(
            ConfigError(
                "reward.overlong_buffer",
                f"{cfg.reward.overlong_buffer} tokens is not shorter than "
                f"data.max_response_length={cfg.data.max_response_length}",
                f"use a buffer below {cfg.data.max_response_length}, or 0 to disable",
            )
        )
    if cfg.model.is_tiny and longest > cfg.model.tiny.max_position_embeddings:
        out.append(
            ConfigError(
                "data.max_response_length",
                f"prompt + response = {longest} tokens exceeds the tiny model's "
                f"model.tiny.max_position_embeddings={cfg.model.tiny.max_position_embeddings}",
                f"raise model.tiny.max_position_embeddings to >= {longest} or shorten the lengths",
            )
        )
    if cfg.rollout.kv_cache_tokens and cfg.rollout.kv_cache_tokens < longest:
        out.append(
            ConfigError(
                "rollout.kv_cache_tokens",
                f"{cfg.rollout.kv_cache_tokens} tokens cannot hold one sequence of {longest} tokens",
                f"set rollout.kv_cache_tokens >= {longest}, or 0 for automatic sizing",
            )
        )
    return out


def _mode_rules(cfg: QuartetConfig) -> list[ConfigError]:
    """`trainer.mode` one_step_off/async: generation overlaps training, so the rollout needs its own pool
    and a step must be able to train on one generated batch as it comes."""
    out: list[ConfigError] = []
    mode = cfg.trainer.mode
    if mode == "sync":
        return out
    if Role.ROLLOUT not in cfg.cluster.separate_pools:
        out.append(
            ConfigError(
                "trainer.mode",
                f"'{mode}' generates while the actor trains, but the rollout shares the actor's pool",
                "add cluster.separate_pools=[rollout] (one more pool of the main pool's shape), or use "
                "trainer.mode=sync",
            )
        )
    if cfg.algorithm.filter_groups:
        out.append(
            ConfigError(
                "algorithm.filter_groups",
                f"dynamic sampling draws more prompts mid-step, which trainer.mode={mode} does not do",
                "use trainer.mode=sync with dynamic sampling, or algorithm.filter_groups=false",
            )
        )
    if cfg.algorithm.adv_estimator == "remax":
        out.append(
            ConfigError(
                "algorithm.adv_estimator",
                f"remax generates a greedy baseline with the current weights, which trainer.mode={mode} "
                "does not keep in step with the sampled responses",
                "use trainer.mode=sync with remax, or a group estimator (grpo, rloo)",
            )
        )
    return out


def sft_rules(cfg: QuartetConfig) -> list[ConfigError]:
    """Cross-field rules of an SFT run (batch split over devices, lengths vs. the tiny model)."""
    sft, world = cfg.sft, cfg.cluster.world_size
    out: list[ConfigError] = []
    if sft.batch_size % world:
        out.append(
            ConfigError(
                "sft.batch_size",
                f"{sft.batch_size} sequences cannot be split evenly over cluster.world_size={world} devices",
                f"make sft.batch_size a multiple of {world}",
            )
        )
    elif (sft.batch_size // world) % sft.micro_batch_size_per_device:
        per_device = sft.batch_size // world
        out.append(
            ConfigError(
                "sft.micro_batch_size_per_device",
                f"{sft.micro_batch_size_per_device} sequences does not divide the {per_device} sequences "
                f"each device gets per step ({sft.batch_size} / {world} devices)",
                f"set sft.micro_batch_size_per_device to one of "
                f"{[d for d in range(1, per_device + 1) if per_device % d == 0]}",
            )
        )
    if cfg.model.is_tiny and sft.max_length > cfg.model.tiny.max_position_embeddings:
        out.append(
            ConfigError(
                "sft.max_length",
                f"{sft.max_length} tokens exceeds the tiny model's "
                f"model.tiny.max_position_embeddings={cfg.model.tiny.max_position_embeddings}",
                f"raise model.tiny.max_position_embeddings to >= {sft.max_length} or lower sft.max_length",
            )
        )
    return out
