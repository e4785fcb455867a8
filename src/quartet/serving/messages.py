"""Chat messages of a request, checked and made ready for the tokenizer's chat template.

- `content` may be a string, null, or a list of text parts (joined; other parts are refused: the chat
  template is text only).
- An assistant message's `tool_calls[].function.arguments` is, in the OpenAI API, a JSON *string*. Chat
  templates (Qwen's Hermes template among them) render `arguments` with `tojson`, so a string would reach the
  prompt double-encoded (`"{\\"a\\": 1}"`) and the model would see history unlike what it wrote. The
  string is decoded to its object here; an object is accepted as is; anything else is a 400 naming the field.
  The function's keys are put in the order the model writes them (`name`, then `arguments`): templates that
  dump the function object keep key order, and the official client sends `arguments` first.
- `tools` must be a list of objects; each `function` tool needs a `function.name`, unique among the tools
  (OpenAI refuses duplicates too: a call naming one would be ambiguous).
"""

from __future__ import annotations

import json
from typing import Any

from quartet.serving.fields import bad, show

__all__ = ["parse_messages", "parse_tools", "text_chars"]


def text_chars(value: Any) -> int:
    """Characters in all strings (keys included) inside a JSON value, counted without recursion."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _content(value: Any, where: str) -> str | None:
    if isinstance(value, list):  # content parts: only text can reach a text-only chat template
        ok = all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in value
        )
        if not ok:
            raise bad(f"'{where}' may only hold text parts ({{'type': 'text', 'text': ...}})", where)
        return "".join(p["text"] for p in value)
    if value is not None and not isinstance(value, str):
        raise bad(f"'{where}' must be a string, a list of text parts or null", where)
    return value


def _tool_call(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad(f"'{where}' must be an object {{'id', 'type': 'function', 'function'}}", where)
    if value.get("type", "function") != "function":
        raise bad(f"'{where}.type' must be 'function', got {show(value.get('type'))}", f"{where}.type")
    function = value.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad(f"'{where}.function' must be an object with a string 'name'", f"{where}.function")
    arguments = function.get("arguments", {})
    param = f"{where}.function.arguments"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError, ValueError):
            raise bad(
                f"'{param}' must be a JSON object encoded as a string, got {show(arguments)}", param
            ) from None
    if not isinstance(arguments, dict):
        raise bad(f"'{param}' must encode a JSON object, got {show(arguments)}", param)
    # name before arguments, as the model writes a Hermes call: templates that dump the function object
    # keep key order, and clients (the official one among them) send "arguments" first
    rest = {k: v for k, v in function.items() if k not in ("name", "arguments")}
    return {
        **value,
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments, **rest},
    }


def _message(value: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(value, dict):
        raise bad(f"'{where}' must be an object with 'role' and 'content'", where)
    role = value.get("role")
    if not isinstance(role, str) or not role:
        raise bad(f"'{where}.role' must be a string, got {show(role)}", f"{where}.role")
    message = {**value, "content": _content(value.get("content"), f"{where}.content")}
    calls = value.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise bad(f"'{where}.tool_calls' must be a list, on an assistant message", f"{where}.tool_calls")
        message["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    for key in ("name", "tool_call_id"):
        if value.get(key) is not None and not isinstance(value[key], str):
            raise bad(f"'{where}.{key}' must be a string", f"{where}.{key}")
    return message


def parse_messages(value: Any) -> list[dict[str, Any]]:
    """The `messages` of a chat body, checked, content parts joined, tool-call arguments decoded."""
    if value is None:
        raise bad("'messages' is required", "messages")
    if not isinstance(value, list) or not value:
        raise bad("'messages' must be a non-empty list of messages", "messages")
    return [_message(m, i) for i, m in enumerate(value)]


def parse_tools(value: Any) -> list[dict[str, Any]] | None:
    """The `tools` of a chat body (None when missing, null or empty)."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise bad("'tools' must be a list of tool objects", "tools")
    names: set[str] = set()
    for i, tool in enumerate(value):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise bad(
                f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name', ...}}}}", f"tools[{i}]"
            )
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad(f"'tools[{i}].function.name' must be a non-empty string", f"tools[{i}].function.name")
        if function["name"] in names:
            raise bad(
                f"'tools[{i}].function.name' {show(function['name'])} is already the name of another tool: "
                "function names must be unique",
                f"tools[{i}].function.name",
            )
        names.add(function["name"])
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise bad(
                f"'tools[{i}].function.parameters' must be a JSON schema object",
                f"tools[{i}].function.parameters",
            )
    return value or None
