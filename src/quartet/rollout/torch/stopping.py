"""When a sequence ends: stop token ids, stop strings, length limits.

Stop strings are matched on decoded text without decoding the whole response at every step: only a tail
window of tokens is decoded, long enough to hold any stop string (each token decodes to at least one byte
and a character has at most 4 bytes, so a string of L characters spans at most 4L tokens). A match in the
window must end in the newest token: an earlier match would already have stopped the sequence. Text is
decoded with `skip_special_tokens=True`, as vLLM's output text is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from quartet.rollout.invalid_request import InvalidRequestError
from quartet.rollout.torch.sequence import SequenceState
from quartet.rollout.types import FinishReason, SamplingParams

if TYPE_CHECKING:  # importing quartet.rollout stays free of transformers until a model is loaded
    from transformers import PreTrainedTokenizerBase

__all__ = ["StopChecker"]


class StopChecker:
    """Decides, after each new token, whether a sequence is finished and why."""

    def __init__(self, eos_token_ids: Iterable[int], tokenizer: PreTrainedTokenizerBase | None) -> None:
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.tokenizer = tokenizer

    def stop_ids(self, params: SamplingParams) -> frozenset[int]:
        """Token ids that end a sequence sampled with `params`."""
        base = frozenset() if params.ignore_eos else self.eos_token_ids
        return base | frozenset(params.stop_token_ids)

    def validate(self, params: SamplingParams) -> None:
        """Raise InvalidRequestError when `params` needs a tokenizer (stop strings) and there is none."""
        if params.stop and self.tokenizer is None:
            raise InvalidRequestError(
                "stop",
                f"stop strings {params.stop} need a tokenizer; give the engine one (or use stop_token_ids)",
            )

    def check(self, seq: SequenceState, step: int) -> None:
        """Finish `seq` (at engine step `step`) if its newest token ends it."""
        token = seq.token_ids[-1]
        # Under `min_tokens` neither stop ids (masked before sampling) nor stop strings end it (vLLM's rule).
        if len(seq.token_ids) < seq.request.sampling.min_tokens:
            if len(seq.token_ids) >= seq.max_new_tokens:
                seq.finish(FinishReason.LENGTH, step)
            return
        if token in seq.stop_ids:
            seq.finish(FinishReason.STOP, step, token)
            return
        if seq.request.sampling.stop:
            matched = self._match_stop_string(seq)
            if matched is not None:
                seq.finish(FinishReason.STOP, step, matched)
                return
        if len(seq.token_ids) >= seq.max_new_tokens:
            seq.finish(FinishReason.LENGTH, step)

    def _match_stop_string(self, seq: SequenceState) -> str | None:
        stops = seq.request.sampling.stop
        window = 4 * max(len(s) for s in stops) + 1
        assert self.tokenizer is not None  # validate() ran at submission
        tail = str(self.tokenizer.decode(seq.token_ids[-window:], skip_special_tokens=True))
        for s in stops:
            if s in tail:
                return s
        return None
