"""Checks a request passes before it joins an engine's batch, so one bad request fails alone.

Two layers:
- `check_sampling` (run by `SamplingParams.__post_init__`): ranges that hold for every engine, e.g.
  temperature finite and >= 0, top-k an int64, seed a 64-bit integer, penalties in vLLM's ranges.
- `check_request` (run by an engine at submission, before the request is queued): what depends on the
  engine, i.e. token ids inside the vocabulary, the prompt inside the context, `n` under the engine's cap.

Every failure is an `InvalidRequestError` naming the field, a `ValueError`, so callers that caught
`ValueError` before keep working and a server can answer 400 with the field's name. Anything that reached a
tensor unchecked (an id past the embedding, `top_k = 2**70`) used to raise inside the engine's step and
fail every request of that step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # types.py imports this module at run time
    from quartet.rollout.types import GenerationRequest, SamplingParams

__all__ = ["MAX_TOP_LOGPROBS", "InvalidRequestError", "RequestLimits", "check_request", "check_sampling"]

MAX_TOP_LOGPROBS = 20
"""Most alternatives per token in `top_logprobs` (OpenAI's limit, vLLM's default `max_logprobs`)."""

_INT64_MAX = (1 << 63) - 1
_SEED_MIN, _SEED_MAX = -(1 << 63), (1 << 64) - 1  # any signed or unsigned 64-bit seed


class InvalidRequestError(ValueError):
    """A request the engine refuses before running it; `field` names the offending input."""

    def __init__(self, field: str, reason: str, request_id: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.request_id = request_id
        where = f"request {request_id}: " if request_id is not None else ""
        super().__init__(f"{where}{field}: {reason}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise InvalidRequestError(field, f"must be finite, got {value}")
    return float(value)


def _integer(field: str, value: object, low: int, high: int) -> int:
    if not _is_int(value):
        raise InvalidRequestError(field, f"must be an integer, got {value!r}")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise InvalidRequestError(field, f"must lie in [{low}, {high}], got {value}")
    return value


def check_sampling(params: SamplingParams) -> None:
    """Raise `InvalidRequestError` when a sampling value is out of range (independent of the engine)."""
    temperature = _finite("temperature", params.temperature)
    if temperature < 0:
        raise InvalidRequestError("temperature", f"must be >= 0 (0 = greedy), got {temperature}")
    top_p = _finite("top_p", params.top_p)
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequestError("top_p", f"must lie in (0, 1], got {top_p}")
    if not _is_int(params.top_k) or params.top_k < 0:
        raise InvalidRequestError("top_k", f"must be >= 0 (0 disables), got {params.top_k!r}")
    _integer("top_k", params.top_k, 0, _INT64_MAX)
    if not _is_int(params.max_new_tokens) or params.max_new_tokens < 1:
        raise InvalidRequestError("max_new_tokens", f"must be >= 1, got {params.max_new_tokens!r}")
    _integer("max_new_tokens", params.max_new_tokens, 1, _INT64_MAX)
    if not _is_int(params.n) or params.n < 1:
        raise InvalidRequestError("n", f"n must be >= 1, got {params.n!r}")
    if params.seed is not None:
        _integer("seed", params.seed, _SEED_MIN, _SEED_MAX)
    for token in params.stop_token_ids:
        _integer("stop_token_ids", token, 0, _INT64_MAX)
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise InvalidRequestError("stop", "stop strings must not be empty")
    for name in ("presence_penalty", "frequency_penalty"):
        value = _finite(name, getattr(params, name))
        if not -2.0 <= value <= 2.0:
            raise InvalidRequestError(name, f"must lie in [-2, 2], got {value}")
    repetition = _finite("repetition_penalty", params.repetition_penalty)
    if repetition <= 0:
        raise InvalidRequestError("repetition_penalty", f"must be > 0 (1 disables), got {repetition}")
    _integer("min_tokens", params.min_tokens, 0, params.max_new_tokens)
    _integer("top_logprobs", params.top_logprobs, 0, MAX_TOP_LOGPROBS)
    if params.grammar is not None and (not isinstance(params.grammar, str) or not params.grammar.strip()):
        raise InvalidRequestError("grammar", "must be a non-empty llguidance grammar string, or None")


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
    bad = [t for t in ids if not _is_int(t) or not 0 <= t < limits.vocab_size]
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
