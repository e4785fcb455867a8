"""The experts of a mixture-of-experts policy in the memory plan: how `model.expert_parallel_size` (ep)
shards them, the all-to-all dispatch it adds, and the routing record (`rollout.record_routing`,
`actor.routing_replay`).

What one rank holds under ep (`engines.expert_parallel`, `engines.fsdp`): each MoE layer's fused expert
weights `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] are first sliced by expert over the "ep" ranks
(E / ep experts each), then FSDP2 shards that slice on its first dimension over "edp" (the world / ep
ranks that hold the same experts), padding every shard to the first one's size. Everything else is
sharded over all ranks, as without ep. So a rank's expert weights, gradients and AdamW states are
ceil((E / ep) / (world / ep)) experts of each layer: 1 / world of them when the division is even, which is
what plain FSDP2 (ceil(E / world)) gives too (`expert_shard`). ep therefore frees no resident state; what it
frees is working memory: a computing rank all-gathers (and reduce-scatters the gradients of) only its
group's E / ep experts of a layer instead of all E (FSDP2 copies them into an unsharded buffer even when
"edp" has one rank), two layers at a time (`gathered_experts`).

What it adds, per MoE layer and one layer at a time (`dispatch_bytes`): the (token, k) pairs travel to
their experts' ranks and back by all-to-all. The pairs' hidden states are in the residual stream's float32
(the engines keep float32 weights and the norm before the MoE block returns float32 under autocast); with
balanced routing a rank sends and receives T k rows of H. The rank keeps the received rows and their copy
sorted by expert (float32), the experts' outputs and the rows the second all-to-all brings back (the compute
dtype c): T k H (2 f + 2 c) bytes. For backward, the experts save their input cast (c H per pair) as the
one-process experts do, and the combine saves the pairs it weights in c (where transformers' eager experts
keep a float32 weighted output): `activations.moe_router_bytes`.

The routing record (docs/moe_routing_replay.md): per token, moe_layers x k expert indices in uint8 (E <= 256)
or int16 (`core.routing.routing_bytes_per_token`): 384 bytes for Qwen3-30B-A3B (48 layers, k = 8, E = 128).
The rollout engine keeps each sequence's record until generation returns (`rollout.torch.routing_record`),
the batch carries it as `routed_experts` [B, P + R, L, k] to the actor and the reference, and a pass that
replays it (or measures the mismatch) widens one micro-batch's slice to int64, plus the routers' own int64
top-k when it measures the mismatch (`engines.routing_replay`).
"""

from __future__ import annotations

from quartet.config.plan import plan_step
from quartet.config.roles import Role
from quartet.config.root import QuartetConfig
from quartet.core.routing import routing_bytes_per_token
from quartet.planning.model_shape import ModelShape
from quartet.planning.plan import Phase, format_bytes

__all__ = [
    "INDEX_BYTES",
    "dispatch_bytes",
    "expert_note",
    "expert_params",
    "expert_shard",
    "gathered_experts",
    "record_bytes_per_token",
    "routing_parts",
    "sharded_elements",
]

F32 = 4
INDEX_BYTES = 8
"""int64: a replayed micro-batch's record and the routers' own top-k (`engines.routing_replay`)."""


def expert_params(shape: ModelShape) -> int:
    """Parameters of the routed experts of all MoE layers (every expert; not the routers nor a shared
    expert, which FSDP2 shards over all ranks as dense weights)."""
    return shape.moe_layers * shape.num_experts * 3 * shape.hidden_size * shape.moe_intermediate_size


def expert_shard(shape: ModelShape, world: int, ep: int = 1) -> int:
    """Experts of each MoE layer whose weights one rank holds: its "ep" slice of E / ep experts, sharded by
    FSDP2 over the world / ep ranks of "edp" with every shard padded to the first's (ceil). 0 when dense."""
    if not shape.is_moe:
        return 0
    local = shape.num_experts // ep
    return -(-local // max(1, world // ep))


def sharded_elements(elements: int, shape: ModelShape, world: int, ep: int = 1) -> int:
    """One rank's share of a sharded state of `elements` that include every routed expert (weights, their
    gradients or one AdamW moment): the experts as `expert_shard` says, the rest 1 / world."""
    experts = expert_params(shape)
    if not experts or elements < experts:
        return elements // world
    per_expert = experts // shape.num_experts
    return (elements - experts) // world + expert_shard(shape, world, ep) * per_expert


def gathered_experts(shape: ModelShape, ep: int) -> int:
    """Experts of one MoE layer that a computing rank all-gathers: its expert group's E / ep."""
    return shape.num_experts // ep if shape.is_moe else 0


def dispatch_bytes(shape: ModelShape, tokens: int, compute_bytes: int) -> int:
    """The all-to-all working memory of one MoE layer under ep for `tokens` tokens on a rank (module doc):
    T k H float32 received rows and their sorted copy, T k H in the compute dtype for the experts' outputs and
    the rows that come back. Balanced routing: a rank receives as many pairs as it sends."""
    pairs = tokens * shape.experts_per_token * shape.hidden_size
    return pairs * (2 * F32 + 2 * compute_bytes)


def record_bytes_per_token(shape: ModelShape) -> int:
    """Bytes of one token's routing record: MoE layers x k indices of the smallest dtype holding E - 1."""
    if not shape.is_moe:
        return 0
    return routing_bytes_per_token(shape.moe_layers, shape.experts_per_token, shape.num_experts)


def routing_parts(
    cfg: QuartetConfig, shape: ModelShape, role: Role, phase: Phase, rows: int, tokens: int
) -> dict[str, int]:
    """The routing record in the row of `role` computing in `phase` (nothing when nothing is recorded):
    the batch's `routed_experts` for the `rows` a rank holds (full length), and in a pass that reads it the
    micro-batch's `tokens` as int64 (the replayed record; in the old-log-prob pass the routers' own top-k
    too, for `moe/routing_mismatch`). The rollout's row holds the records of the sequences it generates."""
    step = plan_step(cfg)
    per_token = record_bytes_per_token(shape)
    if not step.record_routing or not per_token:
        return {}
    seq = cfg.data.max_prompt_length + cfg.data.max_response_length
    out = {"routing_record": rows * seq * per_token}
    if role is Role.ROLLOUT:
        return out
    # the old-log-prob pass measures the mismatch: the record and the routers' own top-k, replayed or not;
    # the other passes read the record only to replay it
    copies = 2 if phase is Phase.OLD_LOG_PROB else int(step.routing_replay)
    per_token_int64 = shape.moe_layers * shape.experts_per_token * INDEX_BYTES
    if copies:
        out["routing_indices"] = copies * tokens * per_token_int64
    return out


def expert_note(cfg: QuartetConfig, shape: ModelShape, update_tokens: int, compute_bytes: int) -> str | None:
    """The plan's note on the policy's experts (None for a dense model): how many each rank holds and
    gathers under `model.expert_parallel_size`, their per-rank bytes, the dispatch of the update's
    micro-batch, and the routing record's size per token when one is kept."""
    if not shape.is_moe:
        return None
    world, ep = cfg.cluster.world_size, cfg.model.expert_parallel_size
    held = expert_shard(shape, world, ep)
    weights = F32 * held * expert_params(shape) // shape.num_experts
    text = (
        f"experts: {shape.num_experts} per MoE layer x {shape.moe_layers} layers; ep {ep}: each rank holds "
        f"{held} of each layer (weights {format_bytes(weights)}, as much again for gradients, twice for "
        f"AdamW) and all-gathers {gathered_experts(shape, ep)} per layer"
    )
    if ep > 1:
        dispatch = dispatch_bytes(shape, update_tokens, compute_bytes)
        text += f"; all-to-all dispatch {format_bytes(dispatch)} per MoE layer (update micro-batch, balanced)"
    if plan_step(cfg).record_routing:
        text += f"; routing record {record_bytes_per_token(shape)} B/token"
    return text
