"""How sequence and tensor parallelism divide one rank's memory: the planner's arithmetic for `model.
sequence_parallel_size` (sp, Ulysses, `engines.ulysses`) and `model.tensor_parallel_size` (tp, DTensor).

The policy's training engine (actor, reference) spreads over the `world` ranks of its pool as
dp x sp x tp: FSDP2 shards what tensor parallelism leaves whole, so every rank holds 1 / world of the
parameters, gradients and optimizer states whatever the split (`state_bytes`). The critic and reward model
run data parallel only (`Layout(world)`).

Rows: the trainer deals rows over all ranks; the ranks of a sequence group pool theirs (`group_rows`) and
run the same micro-batches, and the ranks of a tensor group compute on the same rows too, so the rows one
rank's micro-batcher sees are its own times sp x tp (`pooled_rows`). A packed micro-batch of N tokens is
then split by tokens over the sequence group: N / sp each (`rank_tokens`), and the positions whose logits a
rank computes are those inside its own slice (`rank_logit_positions`).

Tensor parallelism splits attention by heads and the MLP by its intermediate columns, and the LM head by
vocabulary: those activations and the logits are divided by tp (`activations`); the residual stream and
the norms are not (no sequence-parallel TP). Of the weights, the layers' linear modules and the LM head are
split (`tp_linear_params`); the embedding (unless tied to the head) and the norms are whole on every rank.

Expert parallelism (`model.expert_parallel_size`, ep; `planning.experts`): the policy's engines slice each MoE
layer's experts over ep ranks and FSDP2 shards the slice over the other world / ep; a rank's share of the
states is the same as without ep, but it gathers only E / ep experts of a layer (`gathered_params`).
"""

from __future__ import annotations

from dataclasses import dataclass

from quartet.config.roles import Role
from quartet.config.root import QuartetConfig
from quartet.planning.experts import expert_params, gathered_experts, sharded_elements
from quartet.planning.model_shape import HeadKind, ModelShape

__all__ = [
    "Layout",
    "fused_head_on",
    "gathered_params",
    "layout_of",
    "pooled_rows",
    "rank_logit_positions",
    "rank_tokens",
    "state_bytes",
    "tp_linear_params",
]

POLICY_ROLES = (Role.ACTOR, Role.REFERENCE)
"""Roles built from the policy's engine spec: the ones sequence and tensor parallelism apply to."""


@dataclass(frozen=True)
class Layout:
    """How one training engine spreads over the ranks of its pool."""

    world: int
    sp: int = 1
    tp: int = 1
    ep: int = 1
    """Expert parallelism: ranks that split each MoE layer's experts (the policy's engines only)."""

    @property
    def dp(self) -> int:
        """Data-parallel groups: ranks that see different rows."""
        return max(1, self.world // (self.sp * self.tp))

    @property
    def fsdp(self) -> int:
        """Ranks FSDP2 shards each tensor-parallel shard over (every rank outside the tensor group)."""
        return max(1, self.world // self.tp)


def layout_of(cfg: QuartetConfig, role: Role) -> Layout:
    """The layout of `role`'s training engine: the policy's roles take the model's sp, tp and ep, the critic
    its own sp (`critic.sequence_parallel_size`, no TP nor EP), the teacher the model's sp and tp (no EP);
    the reward model runs data parallel only."""
    world = cfg.cluster.world_size
    if role in POLICY_ROLES:
        m = cfg.model
        return Layout(world, m.sequence_parallel_size, m.tensor_parallel_size, m.expert_parallel_size)
    if role is Role.CRITIC:
        return Layout(world, cfg.critic.sequence_parallel_size)
    if role is Role.TEACHER:  # split as the policy, its experts (if any) not
        return Layout(world, cfg.model.sequence_parallel_size, cfg.model.tensor_parallel_size)
    return Layout(world)


def fused_head_on(cfg: QuartetConfig, device: str) -> bool:
    """Whether the policy's engines use the fused LM head: `model.fused_head`, else on when they compute on
    CUDA (as the engine decides)."""
    return device == "gpu" if cfg.model.fused_head is None else cfg.model.fused_head


def state_bytes(
    elements: int, bytes_per_element: int, layout: Layout, shape: ModelShape | None = None
) -> int:
    """Per-rank bytes of a sharded state (weights, gradients, AdamW moments): tensor parallelism splits the
    layers and the head over tp ranks, FSDP2 shards every tensor (split or not) over the other ranks, so
    each rank holds 1 / (tp x fsdp) = 1 / world (the unsplit embedding is sharded over fsdp ranks only, a
    difference the plan leaves out: it is small against the layers). With the `shape` of a mixture of
    experts whose every expert the state includes, the experts are counted as the rank holds them
    (`experts.sharded_elements`: whole experts per shard, padded; the same under ep)."""
    if shape is None or not shape.is_moe:
        return bytes_per_element * elements // layout.world
    return bytes_per_element * sharded_elements(elements, shape, layout.world, layout.ep)


def pooled_rows(rows_per_rank: int, layout: Layout) -> int:
    """Rows the micro-batcher of one rank cuts: its own times sp x tp, because a sequence group pools its
    ranks' rows (`engines.ulysses.group_rows`) and a tensor group computes on the same rows."""
    return rows_per_rank * layout.sp * layout.tp


def rank_tokens(group_tokens: int, sp: int) -> int:
    """Tokens of a packed micro-batch that one rank of a sequence group runs: the length padded up to a
    multiple of sp (`ulysses.padded_length`), split evenly."""
    return -(-group_tokens // sp)


def rank_logit_positions(rows: int, prompt_len: int, response_len: int, sp: int) -> int:
    """The most logit positions any rank of a sequence group computes for `rows` full-length packed rows.

    A row is [prompt, response] end to end with the next; the positions that predict response tokens are
    the row's P - 1 .. P + R - 2. Each rank keeps those inside its contiguous slice, which is not 1 / sp of
    them when rows are few (one row with a long prompt puts most of them on the last rank), so the count is
    exact: the largest over ranks.
    """
    seq = prompt_len + response_len
    share = rank_tokens(rows * seq, sp)
    best = 0
    for r in range(sp):
        start, stop = r * share, (r + 1) * share
        kept = 0
        for row in range(start // seq, min(rows, -(-stop // seq))):
            first = row * seq + prompt_len - 1
            kept += max(0, min(stop, first + response_len) - max(start, first))
        best = max(best, kept)
    return best


def tp_linear_params(shape: ModelShape, head: HeadKind, tp: int) -> int:
    """Linear weights one rank of a tensor group holds: the layers' projections and the LM head split tp
    ways (column- or row-wise, or by vocabulary), a value or score head (D x 1) whole."""
    layers = shape.layers_linear_params // tp
    top = shape.vocab_size * shape.hidden_size // tp if head is HeadKind.CAUSAL_LM else shape.hidden_size
    return layers + top


def gathered_params(shape: ModelShape, head: HeadKind, layout: Layout) -> int:
    """Parameters FSDP2 all-gathers on a computing rank: the root module (embedding, head, final norm) and
    two decoder layers (the running one and the prefetched next), each as this rank's tensor-parallel
    shard; none when FSDP2 has a single rank to gather from. Under expert parallelism a layer's experts are
    its expert group's E / ep only (FSDP2 copies them into an unsharded buffer even when "edp" has one rank).
    """
    if layout.fsdp <= 1:
        return 0
    tp = layout.tp
    layer = shape.layer_params - shape.layer_linear_params + shape.layer_linear_params // tp
    if layout.ep > 1 and shape.is_moe:  # the experts of one layer: E / ep of them, not E
        per_expert = expert_params(shape) // (shape.num_experts * shape.moe_layers)
        layer -= (shape.num_experts - gathered_experts(shape, layout.ep)) * per_expert
    root = shape.params(head) - shape.layers_params
    if head is HeadKind.CAUSAL_LM and tp > 1:
        split = shape.vocab_size * shape.hidden_size  # the head (= the embedding when tied)
        root -= split - split // tp
    return root + 2 * layer
