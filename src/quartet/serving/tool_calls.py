"""`message.tool_calls` from the model's Hermes output, as the OpenAI chat API returns them.

The model writes calls as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (the format of
Qwen's chat templates; `quartet.agents.tools.parsing.HermesParser` reads them). The tags are often special
tokens, so the response is decoded keeping them (`text.decode_keeping`). When every block parses, the
message carries:

- `tool_calls`: `[{"id": "call_<24 hex>", "type": "function", "function": {"name", "arguments"}}]`, with
  `arguments` a JSON *string* (the OpenAI shape; the server decodes it back from the history, see
  `messages`);
- `content`: the prose outside the blocks, or null when there is none;
- `finish_reason`: "tool_calls" when the model ended its turn (a response cut by the length limit keeps
  "length").

`arguments` is always JSON as RFC 8259 defines it: Python's `json` reads `NaN`, `Infinity` and numbers
too large for a float (`1e999`, read as infinity), and would write them back as `NaN` / `Infinity`, which
strict parsers refuse; a call holding one is malformed.

When a block is malformed (bad JSON, a non-finite number, no name, unclosed), no call is returned and
`content` is the text as the model wrote it, tags included, so the caller sees what went wrong (vLLM's
Hermes parser does the same).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from quartet.agents.tools.parsing import HermesParser

__all__ = ["HERMES_TAGS", "AssistantTurn", "parse_assistant_turn"]

HERMES_TAGS = (HermesParser.open_tag, HermesParser.close_tag)
"""The tags that must survive decoding."""


@dataclass(frozen=True)
class AssistantTurn:
    """An assistant message split into prose and OpenAI tool calls."""

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_assistant_turn(text: str) -> AssistantTurn:
    """The OpenAI message parts of a response text (see the module docstring)."""
    if HermesParser.open_tag not in text:
        return AssistantTurn(text)
    parsed = HermesParser().parse(text)
    if parsed.errors or not parsed.calls:
        return AssistantTurn(text)
    try:
        arguments = [json.dumps(call.arguments, ensure_ascii=False, allow_nan=False) for call in parsed.calls]
    except ValueError:  # NaN, Infinity, or a number too large for a float (1e999): not JSON (RFC 8259)
        return AssistantTurn(text)
    calls = [
        {"id": _call_id(), "type": "function", "function": {"name": call.name, "arguments": args}}
        for call, args in zip(parsed.calls, arguments, strict=True)
    ]
    return AssistantTurn(parsed.content or None, calls)
