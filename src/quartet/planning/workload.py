"""Rows and tokens one rank computes on in each phase of a step: what the planner sizes activations from.

Every row is planned at its maximum length (max_prompt_length + max_response_length). The trainer deals
the step's rows over the world's ranks; a rank's micro-batcher cuts the rows it computes on, which under
sequence or tensor parallelism are those of its whole group (`parallel.pooled_rows`). A fixed micro-batch
holds `micro_batch_size_per_device` of them; a token budget holds as many as fill it (padded: the budget's
tokens; packed: whole rows). Under sequence parallelism each rank then runs 1 / sp of the micro-batch's
packed tokens (`parallel.rank_tokens`) and the logits of the positions in its slice.
"""

from __future__ import annotations

from dataclasses import dataclass

from quartet.config.roles import ActorConfig, CriticConfig, MicroBatching, Role
from quartet.config.root import QuartetConfig
from quartet.planning.activations import MicroBatch
from quartet.planning.parallel import Layout, layout_of, pooled_rows, rank_logit_positions, rank_tokens
from quartet.planning.plan import Phase

__all__ = ["Workload"]


@dataclass(frozen=True)
class Workload:
    """Rows and lengths one device sees in a step (every row at its maximum length)."""

    cfg: QuartetConfig
    device: str

    @property
    def world(self) -> int:
        """Ranks of the main pool."""
        return self.cfg.cluster.world_size

    @property
    def seq_len(self) -> int:
        """T: prompt + response positions of a full-length row."""
        return self.cfg.data.max_prompt_length + self.cfg.data.max_response_length

    @property
    def rows_per_step(self) -> int:
        """Rows dealt to one rank per step (train_batch_size x rollout.n over the world)."""
        return -(-self.cfg.data.train_batch_size * self.cfg.rollout.n // self.world)

    @property
    def prompts_per_step(self) -> int:
        """Prompts dealt to one rank per step."""
        return -(-self.cfg.data.train_batch_size // self.world)

    def micro(
        self,
        rows_available: int,
        size: int,
        dynamic: bool,
        budget: int,
        layout: Layout | None = None,
        packed: bool = False,
    ) -> MicroBatch:
        """One rank's share of a micro-batch cut from `rows_available` rows of this rank (pooled over its
        group under `layout`). Fixed: `size` rows (at most those available); dynamic: the token budget filled
        with full rows."""
        t, response = self.seq_len, self.cfg.data.max_response_length
        layout = layout or Layout(self.world)
        available = pooled_rows(rows_available, layout)
        if not packed:
            if dynamic:
                tokens = min(max(budget, t), available * t)
                return MicroBatch(tokens, t, int(tokens / t * (response + 1)))
            rows = max(1, min(size, available))
            return MicroBatch(rows * t, t, rows * (response + 1))
        rows = max(1, min(budget // t if dynamic else size, available))
        sp = layout.sp
        prompt = self.cfg.data.max_prompt_length
        return MicroBatch(
            rank_tokens(rows * t, sp), t, rank_logit_positions(rows, prompt, response, sp), True
        )

    def no_grad(self, m: MicroBatching, layout: Layout | None = None, packed: bool = False) -> MicroBatch:
        """A log-prob or value pass's micro-batch."""
        return self.micro(
            self.rows_per_step,
            m.micro_batch_size_per_device,
            m.use_dynamic_batch,
            m.max_tokens_per_micro_batch,
            layout,
            packed,
        )

    def update(
        self, rc: ActorConfig | CriticConfig, layout: Layout | None = None, packed: bool = False
    ) -> MicroBatch:
        """An update's micro-batch (cut from this rank's share of a mini-batch)."""
        rows = max(1, rc.mini_batch_size * self.cfg.rollout.n // self.world)
        return self.micro(
            rows,
            rc.micro_batch_size_per_device,
            rc.use_dynamic_batch,
            rc.max_tokens_per_micro_batch,
            layout,
            packed,
        )

    def policy_tokens(self, phase: Phase) -> int:
        """Tokens of one micro-batch of the policy's engines (actor, reference) on one rank in `phase`:
        the update's, the reference pass's, else the old-log-prob pass's."""
        cfg = self.cfg
        layout, packed = layout_of(cfg, Role.ACTOR), cfg.model.remove_padding
        if phase is Phase.UPDATE_ACTOR:
            return self.update(cfg.actor, layout, packed).tokens
        logprobs = cfg.reference.logprobs if phase is Phase.REF else cfg.actor.logprobs
        return self.no_grad(logprobs, layout, packed).tokens

    def kv_tokens(self) -> tuple[int, int]:
        """(slots, tokens per slot) of the rollout engine's KV cache."""
        rc = self.cfg.rollout
        per_slot = self.seq_len
        if rc.kv_cache_tokens:
            per_slot = min(per_slot, rc.kv_cache_tokens // rc.max_num_seqs)
        return rc.max_num_seqs, per_slot
