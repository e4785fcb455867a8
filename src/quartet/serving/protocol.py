"""Request bodies of the OpenAI-compatible server, parsed into typed requests; errors name the field.

Two kinds of body:

- **OpenAI bodies** (`/v1/chat/completions`, `/v1/completions`). Every top-level field is either honoured,
  accepted as metadata that changes nothing here (`METADATA_FIELDS`: `user`, `metadata`, ...), or refused
  with a 400 naming it: nothing is silently dropped. Fields that take a value this server cannot honour are
  refused for that value only (`logit_bias` non-empty, `echo`, ...). `response_format` (json_object,
  json_schema) and a forced `tool_choice` ("required", a named function) become a grammar the engine
  decodes under (`constraints`). vLLM's extra sampling fields `top_k` (-1 or 0 disable), `stop_token_ids`,
  `ignore_eos`, `repetition_penalty` and `min_tokens` are accepted, as agent frameworks written against
  vLLM send them. Penalties, `min_tokens` and `top_logprobs` reach the engine through `SamplingParams`
  fields of the same names; where the installed `SamplingParams` has no such field they are refused.
- **Our token body** (`/v1/quartet/generate`): `{"prompt_token_ids": [...], "sampling": {...}}`, where
  `sampling` holds `SamplingParams` fields. That object is ours, so unknown keys there are errors (a typo
  must not silently sample with defaults).

`max_tokens` / `max_completion_tokens` / `max_new_tokens` default to the server's `max_new_tokens_default`
(the OpenAI completions default of 16 tokens would surprise everyone); the engine further caps them to the
model's context. Limits that depend on the server (vocabulary, `max_n`, `max_request_tokens`) are checked
in `limits`, once the prompt's length is known.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quartet.rollout.types import MAX_TOP_LOGPROBS, SamplingParams
from quartet.serving.constraints import ToolPlan, parse_response_format, parse_tool_choice
from quartet.serving.errors import ApiError
from quartet.serving.fields import bad, boolean, build_sampling, integer, number, show, str_list, token_ids
from quartet.serving.images import multi_modal_from_json
from quartet.serving.limits import load_json_body
from quartet.serving.messages import parse_messages, parse_tools, text_chars

__all__ = [
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "METADATA_FIELDS",
    "TOKEN_FIELDS",
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

_OPTIONAL_SAMPLING = {
    "presence_penalty": ("number", 0.0),
    "frequency_penalty": ("number", 0.0),
    "repetition_penalty": ("number", 1.0),
    "min_tokens": ("int", 0),
    "top_logprobs": ("int", 0),
}
_OPTIONAL_KINDS = {"grammar": "str"}
"""`SamplingParams` fields only the token endpoint reads (the OpenAI bodies say it with response_format)."""
"""`SamplingParams` fields this server passes on when the installed `SamplingParams` has them."""


def _engine_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(SamplingParams)}


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
    **{name: kind for name, (kind, _) in _OPTIONAL_SAMPLING.items() if name in _engine_fields()},
    **{name: kind for name, kind in _OPTIONAL_KINDS.items() if name in _engine_fields()},
}
"""JSON kind of each `SamplingParams` field, as the token endpoint reads it (a test keeps it complete)."""

METADATA_FIELDS = frozenset(
    {"model", "user", "metadata", "safety_identifier", "prompt_cache_key", "service_tier", "store"}
)
"""Top-level fields accepted and ignored: they identify or label the request and change no output here
(`store: true` is refused, as nothing is stored)."""

_SAMPLING_BODY_FIELDS = frozenset(
    {"temperature", "top_p", "top_k", "n", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens"}
    | {"presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "logit_bias"}
    | {"stream", "stream_options", "logprobs"}
)
CHAT_FIELDS = (
    METADATA_FIELDS
    | _SAMPLING_BODY_FIELDS
    | {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_completion_tokens",
        "top_logprobs",
        "response_format",
    }
)
"""Every top-level field a chat body may hold."""
COMPLETION_FIELDS = (
    METADATA_FIELDS | _SAMPLING_BODY_FIELDS | {"prompt", "echo", "suffix", "best_of", "prompt_logprobs"}
)
"""Every top-level field a completions body may hold."""
TOKEN_FIELDS = frozenset({"prompt_token_ids", "sampling", "multi_modal", "return_routed_experts"})
"""Every top-level field a `/v1/quartet/generate` body may hold. A routing record is never one: the server
takes routing from its engine only, never from a client (docs/moe_routing_replay.md)."""


@dataclass(frozen=True)
class ChatRequest:
    """A chat completion request: messages for the chat template, and how to sample."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    sampling: SamplingParams
    logprobs: bool
    top_logprobs: int = 0
    """Alternatives per token in the log-prob entries."""
    stream: bool = False
    include_usage: bool = False
    """`stream_options.include_usage`: a last chunk with the usage."""
    parse_tool_calls: bool = False
    """Turn the output's Hermes blocks into `message.tool_calls` (tools given, tool_choice not "none")."""
    text_chars: int = 0
    """Characters of text in the messages and tools (bounded before rendering)."""
    tool_plan: ToolPlan = ToolPlan(parse=False)
    """What `tool_choice` / `parallel_tool_calls` ask: forced calls (a grammar), at most one call."""
    response_schema: dict[str, Any] | None = None
    """The JSON schema of `response_format` (json_object: any object); None: free text."""


@dataclass(frozen=True)
class CompletionRequest:
    """A text completion request: a prompt as text or as token ids."""

    prompt: str | tuple[int, ...]
    sampling: SamplingParams
    logprobs: bool
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    prompt_logprobs: int | None = None
    """vLLM's `prompt_logprobs`: score the prompt, with this many alternatives per token; None: not asked."""


@dataclass(frozen=True)
class TokenRequest:
    """A token-in/token-out request of the `/v1/quartet/generate` endpoint."""

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    multi_modal: dict[str, Any] | None = None
    """The prompt's images (`quartet.serving.images`), for a vision-language model."""
    routed_experts: bool = False
    """Return each output's MoE routing record (`return_routed_experts`; `routing_wire`)."""


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why it is not one (see `limits.load_json_body`)."""
    return load_json_body(raw)


def _refuse_unknown(body: Mapping[str, Any], known: frozenset[str]) -> None:
    for name in body:
        if name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise bad(f"unknown or unsupported field '{name}'{hint}: this server does not implement it", name)


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported by the rollout engine", "logit_bias")
    if body.get("logit_bias") is not None and not isinstance(body["logit_bias"], dict):
        raise bad("'logit_bias' must be an object", "logit_bias")
    if boolean(body, "store", False, "store"):
        raise bad("'store': true is not supported (this server stores nothing)", "store")


def _stream(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = boolean(body, "stream", False, "stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise bad("'stream_options' is only allowed with 'stream': true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad("'stream_options' may only hold 'include_usage'", "stream_options")
    return stream, boolean(options, "include_usage", False, "stream_options.include_usage")


def _optional_sampling(body: Mapping[str, Any], top_logprobs: int) -> dict[str, Any]:
    """Penalties, min_tokens and top_logprobs: passed on when `SamplingParams` has them, else refused."""
    present = _engine_fields()
    values: dict[str, Any] = {"top_logprobs": top_logprobs}
    for name, (kind, default) in _OPTIONAL_SAMPLING.items():
        if name != "top_logprobs":
            values[name] = (
                number(body, name, default, name)
                if kind == "number"
                else integer(body, name, int(default), name)
            )
    fields: dict[str, Any] = {}
    for name, value in values.items():
        if name in present:
            fields[name] = value
        elif value != _OPTIONAL_SAMPLING[name][1]:
            raise bad(f"'{name}' is not supported by this server's rollout engine; leave it out", name)
    return fields


def _openai_sampling(
    body: Mapping[str, Any], max_tokens: int, logprobs: bool, top_logprobs: int
) -> SamplingParams:
    top_k = integer(body, "top_k", 0, "top_k")
    return build_sampling(
        "",
        temperature=number(body, "temperature", 1.0, "temperature"),
        top_p=number(body, "top_p", 1.0, "top_p"),
        top_k=0 if top_k == -1 else top_k,  # vLLM's spelling of "off"
        max_new_tokens=max_tokens,
        n=integer(body, "n", 1, "n"),
        seed=integer(body, "seed", None, "seed"),
        stop=str_list(body, "stop", "stop"),
        stop_token_ids=token_ids(
            [] if body.get("stop_token_ids") is None else body["stop_token_ids"],
            "stop_token_ids",
            allow_empty=True,
        ),
        ignore_eos=boolean(body, "ignore_eos", False, "ignore_eos"),
        return_logprobs=logprobs,
        **_optional_sampling(body, top_logprobs),
    )


def _max_tokens(body: Mapping[str, Any], names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = integer(body, name, None, name)
        if value is not None:
            if not 1 <= value < 2**31:
                raise bad(f"'{name}' must lie in [1, 2**31), got {value}", name)
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


def parse_chat(body: Mapping[str, Any], default_max_tokens: int) -> ChatRequest:
    """A `/v1/chat/completions` body as a `ChatRequest`."""
    _refuse_unknown(body, CHAT_FIELDS)
    _refuse_unsupported(body)
    messages = parse_messages(body.get("messages"))
    tools = parse_tools(body.get("tools"))
    plan = parse_tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"), tools)
    schema = parse_response_format(body.get("response_format"))
    if schema is not None and plan.forced:
        raise bad(
            "'response_format' cannot be combined with a forced 'tool_choice'; drop one", "response_format"
        )
    logprobs = boolean(body, "logprobs", False, "logprobs")
    top = integer(body, "top_logprobs", 0, "top_logprobs") or 0
    if top and not logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    stream, include_usage = _stream(body)
    max_tokens = _max_tokens(body, ("max_completion_tokens", "max_tokens"), default_max_tokens)
    sampling = _openai_sampling(body, max_tokens, logprobs, top)
    chars = text_chars(messages) + (text_chars(tools) if tools else 0)
    return ChatRequest(
        messages, tools, sampling, logprobs, top, stream, include_usage, plan.parse, chars, plan, schema
    )


def parse_completion(body: Mapping[str, Any], default_max_tokens: int) -> CompletionRequest:
    """A `/v1/completions` body as a `CompletionRequest`."""
    _refuse_unknown(body, COMPLETION_FIELDS)
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
    if body.get("echo") is not None and boolean(body, "echo", False, "echo"):
        raise bad("'echo' is not supported", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported", "suffix")
    n = integer(body, "n", 1, "n")
    if body.get("best_of") not in (None, n):
        raise bad("'best_of' is not supported (leave it out, or equal to n)", "best_of")
    top = integer(body, "logprobs", None, "logprobs")
    if top is not None and not 0 <= top <= 5:
        raise bad(f"'logprobs' must lie in [0, 5] (alternatives per token), got {top}", "logprobs")
    stream, include_usage = _stream(body)
    prompt_top = integer(body, "prompt_logprobs", None, "prompt_logprobs")
    if prompt_top is not None and not 0 <= prompt_top <= MAX_TOP_LOGPROBS:
        message = f"'prompt_logprobs' must lie in [0, {MAX_TOP_LOGPROBS}] (alternatives per token)"
        message += f", got {prompt_top}"
        raise bad(message, "prompt_logprobs")
    if prompt_top is not None and stream:
        raise bad("'prompt_logprobs' is not answered in a stream: leave out one of them", "prompt_logprobs")
    max_tokens = _max_tokens(body, ("max_tokens",), default_max_tokens)
    sampling = _openai_sampling(body, max_tokens, top is not None, top or 0)
    return CompletionRequest(parsed, sampling, top is not None, top or 0, stream, include_usage, prompt_top)


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
        elif kind == "str":
            if not isinstance(obj[name], str):
                raise bad(f"'{where}' must be a string, got {show(obj[name])}", where)
            fields[name] = obj[name]
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
    _refuse_unknown(body, TOKEN_FIELDS)
    if "prompt_token_ids" not in body:
        raise bad("'prompt_token_ids' is required", "prompt_token_ids")
    ids = token_ids(body["prompt_token_ids"], "prompt_token_ids")
    images = body.get("multi_modal")
    multi_modal = multi_modal_from_json(images) if images is not None else None
    routing = boolean(body, "return_routed_experts", False, "return_routed_experts")
    sampling = parse_sampling(body.get("sampling"), default_max_tokens)
    return TokenRequest(ids, sampling, multi_modal, routing)


def sampling_to_json(params: SamplingParams) -> dict[str, Any]:
    """The JSON object `parse_sampling` reads back to `params` (what the HTTP replica client sends)."""
    return {
        f.name: (list(v) if isinstance(v := getattr(params, f.name), tuple) else v)
        for f in dataclasses.fields(params)
    }
