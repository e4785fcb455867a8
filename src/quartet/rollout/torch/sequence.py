"""Host-side state of the sequences an engine generates: one per sample of a request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from quartet.rollout.types import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    PromptLogprob,
    TopLogprobs,
)

__all__ = ["SequenceGroup", "SequenceState"]


@dataclass(eq=False)
class SequenceState:
    """One sample being generated: its tokens so far and, once finished, why."""

    request: GenerationRequest
    sample_index: int
    seed: int
    """Seed of this sample's uniforms (see `quartet.rollout.torch.sampling.draw_uniforms`)."""
    max_new_tokens: int
    """The request's limit, lowered so prompt + response fits the model's context."""
    stop_ids: frozenset[int]
    """Token ids that end this sequence (end-of-sequence ids unless ignored, plus the request's)."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)
    """Per generated token, its most likely alternatives (filled only when the request asks for them)."""
    versions: list[int] = field(default_factory=list)
    """Per generated token, the engine's weight version that computed it (`EngineCore.weight_version`)."""
    matcher: Any = None
    """The parser state of the request's grammar (an `llguidance.LLMatcher`, see `rollout.torch.grammar`);
    None: unconstrained."""
    rope_delta: int = 0
    """M-RoPE models: a generated token at index i sits at position i + rope_delta (0 for text prompts)."""
    routing: list[torch.Tensor] | None = None
    """MoE routing record (`routing_record`): the top-k experts [t, L, k] of the tokens fed so far, in
    chunks (the prompt's, shared by the request's samples, then one per decode step); None: not recorded."""
    prompt_logprobs: tuple[PromptLogprob | None, ...] | None = None
    """The prompt's scores when the request asks for them (`prompt_scores`), shared by its samples."""
    error: BaseException | None = None
    """Why the engine failed this sequence (its request then fails with it); None otherwise."""
    first_step: int = -1
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    finish_step: int = -1
    finish_time: float = 0.0

    @property
    def prompt_len(self) -> int:
        """Tokens in the prompt."""
        return len(self.request.prompt_token_ids)

    @cached_property
    def prompt_token_set(self) -> frozenset[int]:
        """The distinct prompt token ids (computed once; the repetition penalty reads it every step)."""
        return frozenset(self.request.prompt_token_ids)

    @property
    def cached_len(self) -> int:
        """Tokens whose keys/values are in the cache: the prompt and all generated tokens but the newest."""
        return self.prompt_len + max(len(self.token_ids) - 1, 0)

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None

    def finish(self, reason: FinishReason, step: int, stop_reason: int | str | None = None) -> None:
        """Mark the sequence finished at engine step `step`."""
        self.finish_reason = reason
        self.stop_reason = stop_reason
        self.finish_step = step
        self.finish_time = time.perf_counter()

    def to_output(self) -> GenerationOutput:
        """The public result (call once finished)."""
        if self.finish_reason is None:
            raise RuntimeError(f"sequence {self.request.request_id}/{self.sample_index} has not finished")
        return GenerationOutput(
            request_id=self.request.request_id,
            sample_index=self.sample_index,
            token_ids=tuple(self.token_ids),
            logprobs=tuple(self.logprobs) if self.request.sampling.return_logprobs else None,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            first_step=self.first_step,
            finish_step=self.finish_step,
            finish_time=self.finish_time,
            top_logprobs=tuple(self.top_logprobs) if self.request.sampling.top_logprobs > 0 else None,
            versions=tuple(self.versions),
            routed_experts=None if self.routing is None else torch.cat(self.routing).cpu(),
            prompt_logprobs=self.prompt_logprobs,
        )


@dataclass(eq=False)
class SequenceGroup:
    """Samples of one request that are admitted together: their prompt is prefilled once and shared."""

    request: GenerationRequest
    sequences: list[SequenceState]

    @property
    def prompt_len(self) -> int:
        """Tokens in the shared prompt."""
        return len(self.request.prompt_token_ids)
