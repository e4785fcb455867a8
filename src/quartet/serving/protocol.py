"""Request bodies of the OpenAI-compatible server, parsed into typed requests; errors name the field.

Two kinds of body:

- **OpenAI bodies** (`/v1/chat/completions`, `/v1/completions`). Unknown top-level fields are ignored: the
  OpenAI API keeps growing and clients send fields such as `user`, `store` or `metadata` that change nothing
  here. Fields this server cannot honour are refused with a 400 naming the field when they ask for
  something (`stream: true`, a non-zero penalty, `top_logprobs` above 0, a non-empty `logit_bias`, ...),
  never silently dropped. vLLM's extra sampling fields `top_k`, `stop_token_ids` and `ignore_eos` are
  accepted, as agent frameworks written against vLLM send them.
- **Our token body** (`/v1/quartet/generate`): `{"prompt_token_ids": [...], "sampling": {...}}`, where
  `sampling` holds `SamplingParams` fields. That object is ours, so unknown keys there are errors (a typo
  must not silently sample with defaults).

`max_tokens` / `max_completion_tokens` / `max_new_tokens` default to the server's `max_new_tokens_default`
(the OpenAI completions default of 16 tokens would surprise everyone); the engine further caps them to the
model's context.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quartet.rollout.types import SamplingParams
from quartet.serving.errors import ApiError
from quartet.serving.fields import bad, boolean, build_sampling, integer, number, show, str_list, token_ids

__all__ = [
    "SAMPLING_FIELD_KINDS",
    "ChatRequest",
    "CompletionRequest",
    "TokenRequest",
    "check_model",
    "parse_chat",
    "parse_completion",
    "parse_json_object",
    "parse_sampling",
    "parse_token_request",
    "sampling_to_json",
]

SAMPLING_FIELD_KINDS: dict[str, str] = {
    "temperature": "number",
    "top_p": "number",
    "top_k": "int",
    "max_new_tokens": "int",
    "n": "int",
    "seed": "int",
    "stop_token_ids": "int_list",
    "stop": "str_list",
    "ignore_eos": "bool",
    "return_logprobs": "bool",
}
"""JSON kind of each `SamplingParams` field, as the token endpoint reads it (a test keeps it complete)."""


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request: messages for the chat template, and how to sample."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    logprobs: bool


@dataclass(frozen=True)
class CompletionRequest:
    """A text completion request: a prompt as text or as token ids."""

    prompt: str | tuple[int, ...]
    sampling: SamplingParams
    logprobs: bool


@dataclass(frozen=True)
class TokenRequest:
    """A token-in/token-out request of the `/v1/quartet/generate` endpoint."""

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(f"the request body is not valid JSON: {exc}", None) from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}", None)
    return body


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    if body.get("stream"):
        raise bad(
            "streaming is not supported by this server: send 'stream': false (or leave it out) and read "
            "the whole response",
            "stream",
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if number(body, name, 0.0, name) != 0.0:
            raise bad(f"'{name}' is not supported (the rollout engine applies no penalties); use 0", name)
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported by the rollout engine", "logit_bias")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise bad("only the 'text' response_format is supported (no constrained decoding)", "response_format")


def _openai_sampling(body: Mapping[str, Any], max_tokens: int, logprobs: bool) -> SamplingParams:
    return build_sampling(
        "",
        temperature=number(body, "temperature", 1.0, "temperature"),
        top_p=number(body, "top_p", 1.0, "top_p"),
        top_k=integer(body, "top_k", 0, "top_k"),
        max_new_tokens=max_tokens,
        n=integer(body, "n", 1, "n"),
        seed=integer(body, "seed", None, "seed"),
        stop=str_list(body, "stop", "stop"),
        stop_token_ids=token_ids(body.get("stop_token_ids") or [], "stop_token_ids", allow_empty=True),
        ignore_eos=boolean(body, "ignore_eos", False, "ignore_eos"),
        return_logprobs=logprobs,
    )


def _max_tokens(body: Mapping[str, Any], names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = integer(body, name, None, name)
        if value is not None:
            if value < 1:
                raise bad(f"'{name}' must be >= 1, got {value}", name)
            return value
    return default


def check_model(body: Mapping[str, Any], served: str) -> None:
    """A 404 when the body names a model other than the one served (a missing `model` is accepted)."""
    model = body.get("model")
    if model is not None and model != served:
        raise ApiError(
            404,
            f"model {show(model)} does not exist; this server serves '{served}'",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def _message(value: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise bad(f"'{where}' must be an object with 'role' and 'content'", where)
    if not isinstance(value.get("role"), str):
        raise bad(f"'{where}.role' must be a string, got {show(value.get('role'))}", f"{where}.role")
    content = value.get("content")
    if isinstance(content, list):  # content parts: only text can reach a text-only chat template
        texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        if len(texts) != len(content) or any(p.get("type") != "text" for p in content):
            raise bad(
                f"'{where}.content' may only hold text parts ({{'type': 'text', 'text': ...}})",
                f"{where}.content",
            )
        content = "".join(texts)
    elif content is not None and not isinstance(content, str):
        raise bad(f"'{where}.content' must be a string, a list of text parts or null", f"{where}.content")
    return {**value, "content": content}


def parse_chat(body: Mapping[str, Any], default_max_tokens: int) -> ChatRequest:
    """A `/v1/chat/completions` body as a `ChatRequest`."""
    _refuse_unsupported(body)
    messages = body.get("messages")
    if messages is None:
        raise bad("'messages' is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of messages", "messages")
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise bad("'tools' must be a list of tool objects", "tools")
    if body.get("tool_choice") not in (None, "auto"):
        raise bad(
            "only tool_choice 'auto' is supported: tools go to the chat template, and the model's "
            "text is returned as it is",
            "tool_choice",
        )
    logprobs = boolean(body, "logprobs", False, "logprobs")
    if integer(body, "top_logprobs", 0, "top_logprobs") != 0:
        raise bad(
            "'top_logprobs' is only supported as 0: the engine returns the log-prob of the sampled "
            "token, not alternatives",
            "top_logprobs",
        )
    max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"), default_max_tokens)
    sampling = _openai_sampling(body, max_tokens, logprobs)
    return ChatRequest([_message(m, i) for i, m in enumerate(messages)], tools or None, sampling, logprobs)


def parse_completion(body: Mapping[str, Any], default_max_tokens: int) -> CompletionRequest:
    """A `/v1/completions` body as a `CompletionRequest`."""
    _refuse_unsupported(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if prompt is None:
        raise bad("'prompt' is required", "prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise bad("'prompt' must not be empty", "prompt")
        parsed: str | tuple[int, ...] = prompt
    elif isinstance(prompt, list) and prompt and not isinstance(prompt[0], str | list):
        parsed = token_ids(prompt, "prompt")
    else:
        raise bad("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")
    if body.get("echo"):
        raise bad("'echo' is not supported", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported", "suffix")
    n = integer(body, "n", 1, "n")
    if body.get("best_of") not in (None, n):
        raise bad("'best_of' is not supported (leave it out, or equal to n)", "best_of")
    top = integer(body, "logprobs", None, "logprobs")
    if top not in (None, 0):
        raise bad(
            "'logprobs' is only supported as 0 (the sampled token's log-prob, no alternatives)", "logprobs"
        )
    max_tokens = _max_tokens(body, ("max_tokens",), default_max_tokens)
    return CompletionRequest(parsed, _openai_sampling(body, max_tokens, top == 0), top == 0)


def parse_sampling(obj: Any, default_max_tokens: int, param: str = "sampling") -> SamplingParams:
    """`SamplingParams` from a JSON object of its fields; unknown keys and wrong types are 400s."""
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise bad(f"'{param}' must be an object of SamplingParams fields", param)
    unknown = sorted(set(obj) - set(SAMPLING_FIELD_KINDS))
    if unknown:
        raise bad(
            f"unknown field(s) {unknown} in '{param}'; known: {sorted(SAMPLING_FIELD_KINDS)}",
            f"{param}.{unknown[0]}",
        )
    fields: dict[str, Any] = {}
    for name, kind in SAMPLING_FIELD_KINDS.items():
        where = f"{param}.{name}"
        if obj.get(name) is None:
            continue
        if kind == "number":
            fields[name] = number(obj, name, 0.0, where)
        elif kind == "int":
            fields[name] = integer(obj, name, None, where)
        elif kind == "bool":
            fields[name] = boolean(obj, name, False, where)
        elif kind == "str_list":
            fields[name] = str_list(obj, name, where)
        else:
            fields[name] = token_ids(obj[name], where, allow_empty=True)
    if fields.setdefault("max_new_tokens", default_max_tokens) < 1:
        raise bad(
            f"'{param}.max_new_tokens' must be >= 1, got {fields['max_new_tokens']}",
            f"{param}.max_new_tokens",
        )
    return build_sampling(f"{param}.", **fields)


def parse_token_request(body: Mapping[str, Any], default_max_tokens: int) -> TokenRequest:
    """A `/v1/quartet/generate` body as a `TokenRequest`."""
    if "prompt_token_ids" not in body:
        raise bad("'prompt_token_ids' is required", "prompt_token_ids")
    ids = token_ids(body["prompt_token_ids"], "prompt_token_ids")
    return TokenRequest(ids, parse_sampling(body.get("sampling"), default_max_tokens))


def sampling_to_json(params: SamplingParams) -> dict[str, Any]:
    """The JSON object `parse_sampling` reads back to `params` (what the HTTP replica client sends)."""
    return {
        f.name: (list(v) if isinstance(v := getattr(params, f.name), tuple) else v)
        for f in dataclasses.fields(params)
    }
