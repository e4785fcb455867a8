"""The counts a mini-batch's loss is normalised by, over every data-parallel rank's rows.

Each rank holds its own rows; a token-mean or sequence-mean loss must divide by the whole mini-batch's
counts, so that the ranks' gradients add up to one process's on all the rows (`spec.LossScale`).
"""

from __future__ import annotations

from quartet.core.batch import Batch
from quartet.core.loss_agg import count_valid_sequences, count_valid_tokens
from quartet.engines.dist import DistContext, all_reduce_sum
from quartet.engines.spec import LossScale

__all__ = ["loss_scale"]


def loss_scale(batch: Batch, ctx: DistContext) -> LossScale:
    """The response tokens, responses and attended tokens of this rank's rows, summed over the ranks."""
    mask = batch["response_mask"]
    counts = [count_valid_tokens(mask), count_valid_sequences(mask), int(batch["attention_mask"].sum())]
    tokens, seqs, attended = all_reduce_sum(counts, ctx)
    return LossScale(tokens=tokens, sequences=seqs, dp_size=ctx.dp, attended_tokens=attended)
