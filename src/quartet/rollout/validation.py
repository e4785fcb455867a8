"""Checks a request passes before it joins an engine's batch, so one bad request fails alone.

Two layers:
- `check_sampling` (run by `SamplingParams.__post_init__`, and defined beside it in `quartet.rollout.types`):
  ranges that hold for every engine, e.g. temperature finite and >= 0, top-k an int64, seed a 64-bit
  integer, penalties in vLLM's ranges.
- `check_request` (run by an engine at submission, before the request is queued): what depends on the
  engine, i.e. token ids inside the vocabulary, the prompt inside the context, `n` under the engine's cap.

Every failure is an `InvalidRequestError` naming the field (`quartet.rollout.invalid_request`). Anything
that reached a tensor unchecked (an id past the embedding, `top_k = 2**70`) used to raise inside the
engine's step and fail every request of that step.
"""

from __future__ import annotations

from dataclasses import dataclass

from quartet.rollout.invalid_request import InvalidRequestError, is_int
from quartet.rollout.types import MAX_TOP_LOGPROBS, GenerationRequest, check_sampling

__all__ = ["MAX_TOP_LOGPROBS", "InvalidRequestError", "RequestLimits", "check_request", "check_sampling"]


@dataclass(frozen=True)
class RequestLimits:
    """What an engine can take: its vocabulary, its context, and a cap on samples per request."""

    vocab_size: int
    """Rows of the model's embedding: valid token ids are 0..vocab_size-1."""

    max_model_len: int
    """Prompt + response limit; the prompt must leave room for at least one generated token."""

    max_n: int | None = None
    """Most samples per request; None: no cap beyond memory."""


def check_request(request: GenerationRequest, limits: RequestLimits) -> None:
    """Raise `InvalidRequestError` when `request` cannot run on an engine with `limits`.

    The response limit (`max_new_tokens`) is not checked against the context: the engine lowers it so that
    prompt + response fits (finish reason LENGTH), as trainers ask one limit for prompts of many lengths.
    """
    rid = request.request_id
    try:
        check_sampling(request.sampling)
    except InvalidRequestError as exc:
        raise InvalidRequestError(exc.field, exc.reason, rid) from None
    ids = request.prompt_token_ids
    if not ids:
        raise InvalidRequestError("prompt_token_ids", "the prompt is empty", rid)
    bad = [t for t in ids if not is_int(t) or not 0 <= t < limits.vocab_size]
    if bad:
        shown = ", ".join(repr(t) for t in bad[:5]) + (", ..." if len(bad) > 5 else "")
        raise InvalidRequestError(
            "prompt_token_ids",
            f"{len(bad)} token id(s) outside the vocabulary [0, {limits.vocab_size}): {shown}",
            rid,
        )
    if len(ids) >= limits.max_model_len:
        raise InvalidRequestError(
            "prompt_token_ids",
            f"prompt of {len(ids)} tokens does not fit the engine's max_model_len={limits.max_model_len} "
            "with room to generate",
            rid,
        )
    if limits.max_n is not None and request.sampling.n > limits.max_n:
        raise InvalidRequestError(
            "n", f"at most {limits.max_n} samples per request, got {request.sampling.n}", rid
        )
