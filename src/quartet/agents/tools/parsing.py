"""Tool calls out of a model turn's text: a `ToolCallParser` protocol, the Hermes format, a small registry.

Hermes (the format Qwen2.5/Qwen3 chat templates teach) writes each call as a JSON object between tags,

    Let me compute that.
    <tool_call>
    {"name": "calculator", "arguments": {"expression": "17 * 23"}}
    </tool_call>

several per turn allowed. `arguments` may also be a JSON-encoded string (some models write it that way,
as the OpenAI API does), and may be left out for a tool without parameters. JSON is read with
`strict=False` so a raw newline inside a string (common in code arguments) is accepted.

A parser never raises on model output: a malformed call (bad JSON, not an object, no name, arguments that
are not an object, an unclosed tag) becomes a line in `ParsedTurn.errors`, phrased for the model, since the
tool loop answers it with that line. `content` is the turn's text outside complete call blocks, stripped;
an unclosed block's text is dropped from it (it was a failed call, not prose).

New formats plug in through `PARSERS` (name -> zero-argument constructor) and `get_parser(name)`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["PARSERS", "HermesParser", "ParsedTurn", "ToolCall", "ToolCallParser", "get_parser"]

_SHOWN_CHARS = 80  # how much of a malformed call the error quotes back to the model


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """A model turn split into prose and calls."""

    content: str
    """The text outside the tool-call blocks, stripped."""
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """One message per malformed call, meant for the model."""


class ToolCallParser(Protocol):
    """Turns a model turn's text into prose and calls; never raises on malformed output."""

    def parse(self, text: str) -> ParsedTurn: ...


def _quote(body: str) -> str:
    body = " ".join(body.split())
    return body if len(body) <= _SHOWN_CHARS else body[:_SHOWN_CHARS] + "..."


def _decode_call(body: str) -> ToolCall | str:
    """The call in a block's body, or the reason it is malformed."""
    try:
        obj = json.loads(body, strict=False)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at char {exc.pos}): {_quote(body)}"
    if not isinstance(obj, dict):
        return f'expected a JSON object {{"name": ..., "arguments": {{...}}}}, got: {_quote(body)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'missing "name" (a non-empty string): {_quote(body)}'
    arguments: Any = obj.get("arguments", {})
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = {}
        else:
            try:
                arguments = json.loads(arguments, strict=False)
            except json.JSONDecodeError as exc:
                return f"arguments of {name!r} are a string that is not valid JSON ({exc.msg})"
    if not isinstance(arguments, dict):
        return f'"arguments" of {name!r} must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name=name.strip(), arguments=arguments)


class HermesParser:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (see the module docstring)."""

    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def parse(self, text: str) -> ParsedTurn:
        prose: list[str] = []
        calls: list[ToolCall] = []
        errors: list[str] = []
        pos = 0
        while (start := text.find(self.open_tag, pos)) != -1:
            prose.append(text[pos:start])
            body_start = start + len(self.open_tag)
            end = text.find(self.close_tag, body_start)
            reopened = text.find(self.open_tag, body_start)
            index = len(calls) + len(errors) + 1
            if end == -1 or (reopened != -1 and reopened < end):
                # Unclosed: the block runs to the next opening tag (parsed on its own) or to the end.
                stop = len(text) if reopened == -1 else reopened
                errors.append(
                    f"tool call {index}: unclosed {self.open_tag} tag (close it with {self.close_tag}): "
                    f"{_quote(text[body_start:stop])}"
                )
                pos = stop
                continue
            decoded = _decode_call(text[body_start:end].strip())
            if isinstance(decoded, str):
                errors.append(f"tool call {index}: {decoded}")
            else:
                calls.append(decoded)
            pos = end + len(self.close_tag)
        prose.append(text[pos:])
        return ParsedTurn(content="".join(prose).strip(), calls=calls, errors=errors)


PARSERS: dict[str, Callable[[], ToolCallParser]] = {"hermes": HermesParser}
"""Known tool-call formats by name; add an entry to plug in another."""


def get_parser(name: str) -> ToolCallParser:
    """A new parser for the format `name` (case-insensitive); `ValueError` listing the known ones."""
    key = name.strip().lower()
    if key not in PARSERS:
        match = difflib.get_close_matches(key, list(PARSERS), n=1)
        hint = f" Did you mean {match[0]!r}?" if match else ""
        raise ValueError(
            f"unknown tool-call parser {name!r}; known parsers: {', '.join(sorted(PARSERS))}.{hint} "
            "Register a new one in quartet.agents.tools.parsing.PARSERS."
        )
    return PARSERS[key]()
