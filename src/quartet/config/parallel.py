"""The parallel layout of a training engine: the rules over its sequence (sp), tensor (tp) and expert (ep)
parallel sizes.

Each rule is stated here once, as arithmetic over numbers, and applied wherever those numbers are known:

    layout_problems   sp, tp and ep themselves, and what they may be combined with  ModelConfig, EngineSpec
    pool_problems     sp, tp and ep against the devices of the engine's pool         validate, the engine
    head_problems     sp and tp against a model's attention and key/value heads      the tiny model's config,
                                                                                     the loaded model (engine)
    expert_problems   ep against a model's experts per MoE layer (none: dense)       the same two
    vision_problem    sequence parallelism on a vision-language model                the same two
    moe_problems      tensor parallelism on a mixture-of-experts model              the same two

Expert parallelism composes with data and sequence parallelism, not with tensor parallelism nor with LoRA
(neither has been made to split experts). An MoE model takes sequence parallelism (its router's statistics
are summed over the sequence group before the loss is formed: `engines.router`), not tensor parallelism
(`moe_problems`).

The problems name their key relative to its section (`sequence_parallel_size`, `tensor_parallel_size`,
`expert_parallel_size`);
the caller places them under it (`ConfigError.under`), as the loader does for a section's own checks. The
fixes name the full key. `section` is `model` for the policy, `critic` for the critic's own sp.
"""

from __future__ import annotations

from quartet.config.errors import ConfigError

__all__ = [
    "divisors",
    "expert_problems",
    "head_problems",
    "layout_problems",
    "moe_problems",
    "pool_problems",
    "vision_problem",
]

SP = "sequence_parallel_size"
TP = "tensor_parallel_size"
EP = "expert_parallel_size"


def divisors(n: int) -> list[int]:
    """The divisors of `n`, smallest first (what a fix offers for a size that must divide `n`)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def _noted(text: str, note: str) -> str:
    return f"{text} ({note})" if note else text


def layout_problems(
    sp: int, tp: int = 1, lora_rank: int = 0, section: str = "model", ep: int = 1
) -> list[ConfigError]:
    """sp, tp and ep of one engine on their own: each at least 1, sp and tp not both above 1, tp and ep not
    both above 1, and neither tp nor ep with LoRA."""
    out: list[ConfigError] = []
    for key, size in ((SP, sp), (TP, tp), (EP, ep)):
        if size < 1:
            out.append(ConfigError(key, f"must be >= 1, got {size}", "use 1 to turn it off"))
    if ep > 1 and tp > 1:
        out.append(
            ConfigError(
                EP,
                f"is {ep} with {TP} {tp}: expert and tensor parallelism are not combined",
                f"set {section}.{TP}: 1 (expert parallelism composes with data and sequence parallelism) "
                f"or {section}.{EP}: 1",
            )
        )
    if ep > 1 and lora_rank:
        out.append(
            ConfigError(
                EP,
                f"is {ep} with LoRA adapters (lora.rank {lora_rank}), which are not split by expert",
                f"set {section}.lora.rank: 0 or {section}.{EP}: 1",
            )
        )
    if tp > 1 and sp > 1:
        out.append(
            ConfigError(
                TP,
                f"is {tp} with {SP} {sp}: sequence and tensor parallelism are not combined",
                f"set {section}.{SP}: 1 or {section}.{TP}: 1",
            )
        )
    if tp > 1 and lora_rank:
        out.append(
            ConfigError(
                TP,
                f"is {tp} with LoRA adapters (lora.rank {lora_rank}), which are not split",
                f"set {section}.lora.rank: 0 or {section}.{TP}: 1",
            )
        )
    return out


def pool_problems(
    sp: int, tp: int, world: int, pool: str, section: str = "model", ep: int = 1
) -> list[ConfigError]:
    """sp, tp and ep against the `world` devices of the engine's pool (`pool` says which, for the message).

    ep needs only to divide the pool: the expert groups are laid over the ranks independently of the
    sequence groups (every rank keeps its own rows or tokens; `engines.expert_parallel`)."""
    out: list[ConfigError] = []
    for key, size in ((SP, sp), (TP, tp), (EP, ep)):
        if world % size:
            out.append(
                ConfigError(
                    key,
                    f"{size} does not divide the {world} devices of {pool}",
                    f"set {section}.{key} to one of {divisors(world)}",
                )
            )
    if not out and world % (sp * tp):
        out.append(
            ConfigError(
                TP,
                f"sequence x tensor parallel = {sp} x {tp} does not divide the {world} devices of {pool}",
                "pick sizes whose product divides the pool's devices",
            )
        )
    return out


def head_problems(
    heads: int, kv: int, sp: int = 1, tp: int = 1, whose: str = "the model's", note: str = ""
) -> list[ConfigError]:
    """sp and tp against a model's `heads` query and `kv` key/value heads (`whose`: which model).

    Tensor parallelism gives each rank heads / tp query and kv / tp key/value heads; Ulysses gives each rank
    heads / sp query heads and repeats key/value heads that sp does not divide up to the query heads, which
    needs heads to be a multiple of kv."""
    out: list[ConfigError] = []
    if heads % tp or kv % tp:
        out.append(
            ConfigError(
                TP,
                _noted(f"{tp} does not divide {whose} {heads} attention and {kv} key/value heads", note),
                f"pick a common divisor of {heads} and {kv}",
            )
        )
    if heads % sp:
        out.append(
            ConfigError(
                SP,
                _noted(f"{sp} does not divide {whose} {heads} attention heads", note),
                f"pick a divisor of {heads}",
            )
        )
    elif kv % sp and heads % kv:  # repeating key/value heads up to the query heads needs heads = k x kv
        problem = (
            f"{sp} does not divide {whose} {kv} key/value heads, "
            f"nor are its {heads} query heads a multiple of them"
        )
        out.append(ConfigError(SP, _noted(problem, note), f"pick a divisor of {kv}"))
    return out


def expert_problems(experts: int, ep: int, whose: str = "the model's", note: str = "") -> list[ConfigError]:
    """ep against a model's `experts` per MoE layer (0: a dense model, which has no experts to split)."""
    if ep == 1:
        return []
    if experts <= 0:
        return [
            ConfigError(
                EP,
                _noted(f"is {ep} but {whose} layers have no experts (a dense model)", note),
                "set model.expert_parallel_size: 1, or use a mixture-of-experts model (e.g. "
                "model.tiny.arch: qwen3_moe)",
            )
        ]
    if experts % ep:
        return [
            ConfigError(
                EP,
                _noted(f"{ep} does not divide {whose} {experts} experts per layer", note),
                f"pick a divisor of {experts}",
            )
        ]
    return []


def vision_problem(sp: int, section: str = "model", note: str = "") -> ConfigError | None:
    """Sequence parallelism on a vision-language model: refused (the vision tower would see a slice of the
    tokens)."""
    if sp == 1:
        return None
    reason = "the vision tower would see a slice of the tokens" + (f"; {note}" if note else "")
    return ConfigError(
        SP,
        f"is {sp}: sequence parallelism does not split vision-language models yet ({reason}; docs/vision.md)",
        f"set {section}.{SP}: 1",
    )


def moe_problems(tp: int, section: str = "model", note: str = "") -> list[ConfigError]:
    """Tensor parallelism on a mixture-of-experts model: refused (docs/moe.md): the plan
    (`engines.tensor_parallel`) splits dense MLP projections; the fused 3-D expert weights and the router
    are not in it. (Sequence parallelism runs: the router's statistics are summed over the sequence group,
    `engines.router`.)"""
    if tp == 1:
        return []
    why = f" ({note})" if note else ""
    return [
        ConfigError(
            TP,
            f"is {tp} on a mixture-of-experts model{why}: the tensor-parallel plan does not split "
            "experts (docs/moe.md)",
            f"set {section}.{TP}: 1",
        )
    ]
