"""`POST /v1/responses`: the text and function-tool subset of OpenAI's Responses API, over the chat path.

Newer agent SDKs call the Responses API instead of chat completions. A Responses body is turned into a
`ChatRequest` (`parse_responses`), answered by the same chat path (template, engine, Hermes tool parser,
constrained decoding), and the `chat.completion` answer is turned into a `response` object
(`response_object`) or its server-sent events (`response_events`).

Request fields honoured:
- `input`: a string (one user message) or a list of items: messages (`{"role", "content"}`, with or
  without `"type": "message"`; roles user, assistant, system, and developer as system; content a string or
  `input_text` / `output_text` parts), `function_call` items (an earlier call of the model: `call_id`,
  `name`, `arguments`), and `function_call_output` items (`call_id`, `output`: the tool's answer, a tool
  message in the chat template; its `call_id` must be that of a `function_call` item before it, as OpenAI
  requires);
- `instructions` (a system message before the input), `tools` (function tools only: `{"type": "function",
  "name", "description", "parameters", "strict"}`), `tool_choice` ("auto", "none", "required",
  `{"type": "function", "name"}`), `parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`,
  `text.format` (text, json_object, json_schema: constrained as `response_format` is), `stream`, and
  the labels `model`, `metadata`, `user`, `store` (false or absent), `truncation` ("disabled"),
  `service_tier`, `prompt_cache_key`, `safety_identifier`.
Everything else (`previous_response_id`, `conversation`, `background`, `reasoning`, `include`, built-in
tools, image or file inputs, ...) is a 400 naming the field: the server keeps no state between calls, so a
client must send the whole conversation as `input` each turn.

Output: a `message` item with one `output_text` part (when the model wrote prose, or wrote nothing else),
then one `function_call` item per parsed tool call. `status` is "completed", or "incomplete" with
`incomplete_details.reason` "max_output_tokens" when the token limit cut the response.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from quartet.serving.errors import ApiError
from quartet.serving.fields import bad, boolean, integer, show
from quartet.serving.protocol import METADATA_FIELDS, ChatRequest, parse_chat

__all__ = ["RESPONSES_FIELDS", "ResponsesRequest", "parse_responses", "response_events", "response_object"]

RESPONSES_FIELDS = METADATA_FIELDS | {
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "text",
    "truncation",
}
"""Every top-level field a Responses body may hold."""

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses body: the chat request it becomes, and what the response object echoes."""

    chat: ChatRequest
    echo: dict[str, Any]
    """Request fields the `response` object repeats (instructions, tools, tool_choice, ...)."""


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    ok = isinstance(content, list) and all(
        isinstance(p, dict)
        and p.get("type") in ("input_text", "output_text")
        and isinstance(p.get("text"), str)
        for p in content
    )
    if not ok:
        raise bad(f"'{where}' must be a string or a list of input_text / output_text parts", where)
    return "".join(p["text"] for p in content)


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str):
            raise bad(f"'{where}.{key}' must be a string", f"{where}.{key}")
    function = {"name": item["name"], "arguments": item["arguments"]}
    return {"id": item["call_id"], "type": "function", "function": function}


def _append_item(messages: list[dict[str, Any]], item: Any, where: str) -> None:
    """Add one input item to the chat messages (function calls join the assistant turn before them)."""
    if not isinstance(item, dict):
        raise bad(f"'{where}' must be an input item object", where)
    kind = item.get("type", "message")
    if kind == "message":
        role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise bad(
                f"'{where}.role' must be one of {sorted(_ROLES)}, got {show(item.get('role'))}",
                f"{where}.role",
            )
        messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
    elif kind == "function_call":
        call = _function_call(item, where)
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str):
            raise bad(f"'{where}.call_id' must be a string", f"{where}.call_id")
        known = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
        if item["call_id"] not in known:
            raise bad(
                f"'{where}.call_id' {show(item['call_id'])} matches no function_call item before it "
                "(send the call with its output: this server keeps no state)",
                f"{where}.call_id",
            )
        output = _text(item.get("output"), f"{where}.output")
        # the call's name too: templates such as Hermes' refuse a tool message without it
        name = known[item["call_id"]]
        messages.append({"role": "tool", "name": name, "tool_call_id": item["call_id"], "content": output})
    else:
        raise bad(
            f"'{where}.type' {show(kind)} is not supported: only message, function_call and "
            "function_call_output items",
            f"{where}.type",
        )


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            _append_item(messages, item, f"input[{i}]")
    else:
        raise bad("'input' must be a string or a non-empty list of input items", "input")
    return messages


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Responses function tools (flat) as chat tools (`{"type", "function": {...}}`)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad("'tools' must be a list of function tools", "tools")
    tools = []
    names: set[Any] = set()
    for i, tool in enumerate(value):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else tool
            raise bad(
                f"'tools[{i}].type' {show(kind)} is not supported: only function tools", f"tools[{i}].type"
            )
        name = tool.get("name")
        if isinstance(name, str) and name in names:
            raise bad(
                f"'tools[{i}].name' {show(name)} is already the name of another tool: function names must "
                "be unique",
                f"tools[{i}].name",
            )
        names.add(name)
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools


def _response_format(text: Any) -> Any:
    """`text.format` as the chat `response_format` it stands for."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format"}:
        raise bad("'text' may only hold 'format'", "text")
    fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        spec = {k: v for k, v in fmt.items() if k != "type"}
        return {"type": "json_schema", "json_schema": spec}
    return fmt


def _refuse(body: Mapping[str, Any]) -> None:
    for name in body:
        if name not in RESPONSES_FIELDS:
            raise bad(
                f"unknown or unsupported field '{name}': this server implements the text and function-tool "
                "subset of the Responses API and keeps no state (send the whole conversation as 'input')",
                name,
            )
    if body.get("truncation") not in (None, "disabled"):
        raise bad("only 'truncation': 'disabled' is supported", "truncation")


def parse_responses(body: Mapping[str, Any], default_max_tokens: int) -> ResponsesRequest:
    """A `/v1/responses` body as the chat request it stands for (400s name the Responses field)."""
    _refuse(body)
    max_output = integer(body, "max_output_tokens", None, "max_output_tokens")
    chat_body = {
        "messages": _messages(body),
        "tools": _tools(body.get("tools")),
        "tool_choice": body.get("tool_choice"),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "max_completion_tokens": max_output,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "response_format": _response_format(body.get("text")),
        "store": body.get("store"),
    }
    try:
        chat = parse_chat({k: v for k, v in chat_body.items() if v is not None}, default_max_tokens)
    except ApiError as exc:
        param = exc.param or ""
        renamed = {"max_completion_tokens": "max_output_tokens", "response_format": "text.format"}
        for old, new in renamed.items():
            param = param.replace(old, new)
        message = exc.message
        for old, new in renamed.items():
            message = message.replace(old, new)
        raise ApiError(exc.status, message, exc.error_type, param) from None
    chat = replace(chat, stream=boolean(body, "stream", False, "stream"))
    echo = {
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "max_output_tokens": max_output,
        "temperature": chat.sampling.temperature,
        "top_p": chat.sampling.top_p,
        "metadata": body.get("metadata") or {},
        "text": body.get("text") or {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": False,
    }
    return ResponsesRequest(chat, echo)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _output(message: Mapping[str, Any], status: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        part: dict[str, Any] = {
            "type": "output_text",
            "text": message.get("content") or "",
            "annotations": [],
            "logprobs": [],
        }
        items.append(
            {
                "type": "message",
                "id": _item_id("msg"),
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        )
    for call in calls:
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "id": _item_id("fc"),
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return items


def response_object(model: str, request: ResponsesRequest, answer: Mapping[str, Any]) -> dict[str, Any]:
    """The `response` object of a finished `chat.completion` answer (one choice)."""
    choice = answer["choices"][0]
    cut = choice["finish_reason"] == "length"
    status = "incomplete" if cut else "completed"
    usage = answer["usage"]
    return {
        "id": _item_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": _output(choice["message"], status),
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        **request.echo,
    }


def _item_events(index: int, item: dict[str, Any], piece_chars: int) -> Iterator[dict[str, Any]]:
    """The events that stream one output item: added, its text or arguments in deltas, done."""
    yield {"type": "response.output_item.added", "output_index": index, "item": _opened(item)}
    where = {"item_id": item["id"], "output_index": index}
    if item["type"] == "message":
        part = item["content"][0]
        text = part["text"]
        at = {**where, "content_index": 0}
        yield {"type": "response.content_part.added", **at, "part": {**part, "text": ""}}
        for i in range(0, len(text), piece_chars):
            yield {
                "type": "response.output_text.delta",
                **at,
                "delta": text[i : i + piece_chars],
                "logprobs": [],
            }
        yield {"type": "response.output_text.done", **at, "text": text, "logprobs": []}
        yield {"type": "response.content_part.done", **at, "part": part}
    else:
        yield {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]}
        yield {
            "type": "response.function_call_arguments.done",
            **where,
            "arguments": item["arguments"],
            "name": item["name"],
        }
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _opened(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as announced before its content: in progress, empty."""
    if item["type"] == "message":
        return {**item, "status": "in_progress", "content": []}
    return {**item, "status": "in_progress", "arguments": ""}


def response_events(response: dict[str, Any], piece_chars: int = 64) -> Iterator[dict[str, Any]]:
    """The server-sent events of a finished `response` object, numbered by `sequence_number`.

    response.created, response.in_progress, per output item its added / delta / done events, then
    response.completed (or response.incomplete when the token limit cut it).
    """
    opened = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opened},
        {"type": "response.in_progress", "response": opened},
    ]
    for index, item in enumerate(response["output"]):
        events.extend(_item_events(index, item, piece_chars))
    last = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": last, "response": response})
    for number, event in enumerate(events):
        yield {**event, "sequence_number": number}
