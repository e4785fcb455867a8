"""What one request may ask of the server, checked before anything reaches the tokenizer or the engine.

The engine decodes every request in one shared batch, so one bad request can fail the others in flight
(an out-of-vocabulary id indexes past the embedding table for the whole batch; an int too large for a
tensor fails the batch's tensor build). The server therefore answers every such request itself, 4xx:

- the body: at most `max_body_bytes` (413 above, aiohttp's `client_max_size`), strict UTF-8 JSON, nested
  at most `MAX_JSON_DEPTH` deep, integers of at most `MAX_INT_DIGITS` digits, no NaN / Infinity, no lone
  surrogates in any string (they cannot be encoded for the tokenizer); the message names the JSON path;
- text to tokenize: at most `max_prompt_chars` characters (`PROMPT_CHARS_PER_TOKEN` per allowed token),
  refused before tokenizing, as tokenizing costs time and memory in proportion to the text;
- token ids (prompt and `stop_token_ids`) below the vocabulary size, `n` at most `max_n`, and the prompt
  plus `n` x `max_tokens` at most `max_request_tokens`;
- sampling numbers in ranges the engine computes safely in float32 / int64 (`check_sampling`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from quartet.rollout.types import SamplingParams
from quartet.serving.errors import ApiError

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_JSON_DEPTH",
    "MAX_SCHEMA_PROPERTIES",
    "MAX_SEED",
    "MAX_STOP",
    "MAX_STOP_CHARS",
    "MAX_TEMPERATURE",
    "MAX_TOP_LOGPROBS",
    "MIN_TEMPERATURE",
    "PROMPT_CHARS_PER_TOKEN",
    "RequestLimits",
    "check_sampling",
    "check_text_size",
    "check_token_ids",
    "load_json_body",
]

MAX_JSON_DEPTH = 64
"""Deepest nesting of a request body (tool schemas nest a few levels; nothing legitimate nests 64)."""
MAX_INT_DIGITS = 40
"""Longest JSON integer in digits (a token id or seed has at most 20)."""
MAX_SEED = 2**63 - 1
"""Seeds lie in [-2**63, 2**63), as OpenAI's int64 `seed`."""
MAX_STOP = 64
"""Most stop strings and most stop token ids per request (each is checked at every engine step)."""
MAX_STOP_CHARS = 1024
"""Longest stop string."""
MAX_TOP_LOGPROBS = 20
"""Most alternatives per token (`top_logprobs`), as OpenAI."""
MIN_TEMPERATURE = 1e-3
"""Smallest non-zero temperature: logits / T must stay finite in float32 (below: use 0, greedy)."""
MAX_TEMPERATURE = 100.0
"""Largest temperature (above it the distribution is uniform to float32 precision anyway)."""
MAX_SCHEMA_PROPERTIES = 400
"""Most `properties` one object of a JSON schema may declare (response_format, forced tools' parameters).
llguidance's parser holds at most 2000 items in a row, and an object with n optional properties opens a row
of 4n + 7: 498 compile, 499 fail mid-request ("Current row has 2003 items", an HTTP 500 before this limit).
400 leaves a margin for what else shares the row (a tool call's name, `anyOf` branches)."""
PROMPT_CHARS_PER_TOKEN = 8
"""Characters of prompt text allowed per token of `max_request_tokens` before tokenizing is refused."""


@dataclass(frozen=True)
class RequestLimits:
    """The bounds of one server (`rollout.server.max_n`, `max_request_tokens`, `max_body_bytes`)."""

    vocab_size: int
    """Token ids must lie in [0, vocab_size): the engine's embedding rows that the tokenizer knows."""
    max_n: int = 64
    """Most responses per request."""
    max_request_tokens: int = 262144
    """Most tokens per request: prompt + n x max_tokens."""
    max_body_bytes: int = 8 * 2**20
    """Largest request body."""

    def __post_init__(self) -> None:
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")
        if self.max_n < 1:
            raise ValueError(f"max_n must be >= 1, got {self.max_n}")
        if self.max_request_tokens < 2:
            raise ValueError(f"max_request_tokens must be >= 2, got {self.max_request_tokens}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")

    @property
    def max_prompt_chars(self) -> int:
        """Most characters of text (all messages together) accepted for tokenizing."""
        return PROMPT_CHARS_PER_TOKEN * self.max_request_tokens


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError.bad_request(message, param)


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _NumberError(f"an integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_constant(name: str) -> Any:
    raise _NumberError(f"{name} (not JSON: numbers must be finite)")


class _NumberError(ValueError):
    """A number the body may not hold (raised from inside `json.loads`)."""


def _walk(value: Any) -> Iterator[tuple[str, Any, int]]:
    """(path, value, depth) of every value in a parsed body, iteratively (no recursion on deep input)."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        path, item, depth = stack.pop()
        yield path, item, depth
        if isinstance(item, dict):
            for key, child in item.items():
                stack.append((f"{path}.{key}" if path else str(key), child, depth + 1))
                if isinstance(key, str):
                    stack.append((f"{path}.<key>" if path else "<key>", key, depth + 1))
        elif isinstance(item, list):
            stack.extend((f"{path}[{i}]", child, depth + 1) for i, child in enumerate(item))


def load_json_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 naming what is wrong and where (see the module docstring)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"the request body is not valid UTF-8: {exc.reason} at byte {exc.start}", None) from None
    try:
        body = json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except _NumberError as exc:
        raise _bad(f"the request body holds {exc}", None) from None
    except json.JSONDecodeError as exc:
        raise _bad(f"the request body is not valid JSON: {exc}", None) from None
    except RecursionError:
        raise _bad(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels", None) from None
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    for path, value, depth in _walk(body):
        if depth > MAX_JSON_DEPTH:
            field = path.split(".")[0].split("[")[0]  # the top-level field that holds it
            raise _bad(f"'{field}' is nested deeper than {MAX_JSON_DEPTH} levels", field)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise _bad(
                    f"'{path}' holds a lone UTF-16 surrogate (\\u{ord(value[_lone(value)]):04x}), "
                    "which is not text",
                    path or None,
                ) from None
    return body


def _lone(text: str) -> int:
    return next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)


def check_text_size(chars: int, limits: RequestLimits, param: str) -> None:
    """A 400 when `chars` characters of prompt text are more than the server tokenizes."""
    if chars > limits.max_prompt_chars:
        raise _bad(
            f"'{param}' holds {chars} characters of text, more than this server tokenizes "
            f"({limits.max_prompt_chars}: {PROMPT_CHARS_PER_TOKEN} per token of max_request_tokens "
            f"{limits.max_request_tokens})",
            param,
        )


def check_token_ids(ids: tuple[int, ...] | list[int], limits: RequestLimits, param: str) -> None:
    """A 400 when an id is outside [0, vocab_size)."""
    for i, t in enumerate(ids):
        if not 0 <= t < limits.vocab_size:
            raise _bad(
                f"'{param}[{i}]' = {t} is not a token id of this model (ids lie in [0, {limits.vocab_size}))",
                param,
            )


def check_sampling(
    sampling: SamplingParams, prompt_tokens: int, limits: RequestLimits, names: dict[str, str]
) -> None:
    """A 400 when `sampling` with a prompt of `prompt_tokens` ids exceeds `limits`.

    names: how the caller spelled each field (`max_new_tokens` -> `max_tokens` in an OpenAI body).
    """
    if sampling.n > limits.max_n:
        raise _bad(
            f"'{names['n']}' = {sampling.n} is more than this server's max_n ({limits.max_n})", names["n"]
        )
    total = prompt_tokens + sampling.n * sampling.max_new_tokens
    if total > limits.max_request_tokens:
        param = names["max_new_tokens"] if prompt_tokens < limits.max_request_tokens else names["prompt"]
        raise _bad(
            f"this request may cost {prompt_tokens} prompt tokens + n ({sampling.n}) x "
            f"{names['max_new_tokens']} ({sampling.max_new_tokens}) = {total} tokens, more than this "
            f"server's max_request_tokens ({limits.max_request_tokens})",
            param,
        )
    check_token_ids(sampling.stop_token_ids, limits, names["stop_token_ids"])
