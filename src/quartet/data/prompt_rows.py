"""What a valid RL prompt row is: its columns checked, each failure a `RowProblem` naming the column and fix.

The row layout is verl's (`quartet.data.prompts` describes it). A missing column is suggested by spelling or
by the names other datasets use; a message must have a role of OpenAI's chat API and text content (unless
it is an empty tool result or an assistant turn that only calls tools); the ground truth is found by a
dotted path and handed on as text. The dataset (`quartet.data.prompts`) then renders and tokenizes the row.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from quartet.config.data import DataConfig
from quartet.data.errors import RowProblem

__all__ = ["CHAT_ROLES", "CheckedRow", "check_row", "parse_messages"]


@dataclass(frozen=True)
class CheckedRow:
    """A checked row, before tokenizing."""

    messages: list[dict[str, Any]]
    data_source: str
    ground_truth: str
    extra_info: dict[str, Any]
    agent_name: str | None
    images: tuple[bytes, ...] = ()
    """The row's encoded images (`data.image_key`), in the order of its `<image>` placeholders."""


# Names other datasets use for what a config key points at: suggested when no name is close in spelling.
_ALIASES = {
    "data.prompt_key": ("prompt", "messages", "conversations", "conversation", "chat"),
    "data.data_source_key": ("data_source", "source", "dataset", "task"),
    "data.ground_truth_key": ("ground_truth", "answer", "solution", "target", "label", "reference"),
}


def _suggest(config_key: str, wanted: str, available: Iterable[str], prefix: str = "") -> str:
    """`set data.prompt_key=prompts` when a column close to `wanted` (or a usual alias) exists; else list
    the columns."""
    names = sorted(str(a) for a in available)
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.5)
    close = close or [a for a in _ALIASES.get(config_key, ()) if a in names][:1]
    if close:
        return f"set {config_key}={prefix}{close[0]} if that is the column you mean (columns: {names})"
    return f"add the column, or point {config_key} at one of the columns {names}"


# The roles of OpenAI's chat API (verl hands messages to the chat template as they are): `developer` is its
# newer name for `system`, `function` the result of a legacy function call. Anything else is a typo or a
# role no chat template renders as meant (some drop the message, some raise mid-load).
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")
_INSTRUCTION_ROLES = ("system", "developer")
# Roles whose content may be empty: an assistant turn that only calls tools, and a tool that returned
# nothing (an empty output is still an answer the model must read).
_MAY_BE_EMPTY = ("tool", "function")


def _message(message: Any, name: str) -> dict[str, Any]:
    """One message checked: a known role, and text content unless it is an empty tool result or an
    assistant turn that only calls tools. Raises `RowProblem` naming the field."""
    if not isinstance(message, dict):
        got = type(message).__name__
        raise RowProblem("bad_prompt", name, f"expected a {{role, content}} message, got {got}")
    role = message.get("role")
    content = message.get("content")
    calls = message.get("tool_calls")
    if not isinstance(role, str) or not role:
        raise RowProblem("bad_prompt", f"{name}.role", f"expected a non-empty string, got {role!r}")
    if role not in CHAT_ROLES:
        close = difflib.get_close_matches(role.lower(), CHAT_ROLES, n=1, cutoff=0.6)
        fix = f"did you mean '{close[0]}'? " if close else ""
        raise RowProblem(
            "unknown_role", f"{name}.role", f"unknown role {role!r}", fix + f"use one of {list(CHAT_ROLES)}"
        )
    if not isinstance(content, str) and not (content is None and calls):
        got = type(content).__name__
        raise RowProblem("bad_prompt", f"{name}.content", f"expected a string, got {got}")
    if not (content or "").strip() and not calls and role not in _MAY_BE_EMPTY:
        raise RowProblem("empty_message", f"{name}.content", f"the {role} message has no text ({content!r})")
    # Parquet gives every struct field to every message (None where absent): drop the absent ones, so a
    # template testing `message.get('tool_calls')` sees what the writer wrote.
    return {k: v for k, v in message.items() if v is not None or k == "content"}


def parse_messages(value: Any, column: str) -> list[dict[str, Any]]:
    """`value` checked as a non-empty list of {role, content} messages with a known role (`CHAT_ROLES`) and
    text content (empty only for a tool result or an assistant turn with `tool_calls`), not all system
    messages. Raises `RowProblem` naming the column; each such row is a bad row, not a prompt the model
    would be trained to answer with nothing to answer."""
    if isinstance(value, (tuple, np.ndarray)):  # rows from pandas / numpy-backed readers
        value = list(value)
    if not isinstance(value, list):
        fix = 'wrap it as [{"role": "user", "content": ...}]' if isinstance(value, str) else ""
        raise RowProblem(
            "bad_prompt",
            column,
            f"expected a list of {{role, content}} messages, got {type(value).__name__}",
            fix,
        )
    if not value:
        raise RowProblem("empty_prompt", column, "the prompt has no messages")
    messages = [_message(message, f"{column}[{i}]") for i, message in enumerate(value)]
    if all(m["role"] in _INSTRUCTION_ROLES for m in messages):
        raise RowProblem(
            "system_only_prompt",
            column,
            "the prompt has only system messages: nothing for the model to answer",
            'add the question as a {"role": "user", "content": ...} message',
        )
    return messages


def _ground_truth(row: Mapping[str, Any], dotted: str) -> str:
    """The value at the dotted path `dotted`, as text (JSON for lists and objects)."""
    value: Any = row
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(value, Mapping) or part not in value:
            where = ".".join(parts[:depth])
            keys = list(value) if isinstance(value, Mapping) else []
            prefix = f"{where}." if where else ""
            inside = f"inside '{where}' (keys {sorted(map(str, keys))})" if where else "in the row"
            raise RowProblem(
                "missing_column" if depth == 0 else "missing_ground_truth",
                dotted,
                f"no '{part}' {inside}",
                _suggest("data.ground_truth_key", part, keys, prefix),
            )
        value = value[part]
    if value is None or (isinstance(value, str) and not value.strip()):
        raise RowProblem("missing_ground_truth", dotted, f"the ground truth is empty ({value!r})")
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def check_row(row: Mapping[str, Any], cfg: DataConfig) -> CheckedRow:
    """The row's messages, data source, ground truth, extra info and agent; `RowProblem` naming the column
    and the fix when one is missing or malformed."""
    if cfg.prompt_key not in row:
        raise RowProblem(
            "missing_column",
            cfg.prompt_key,
            "no such column",
            _suggest("data.prompt_key", cfg.prompt_key, row),
        )
    messages = parse_messages(row[cfg.prompt_key], cfg.prompt_key)
    key = cfg.data_source_key
    if key not in row:
        raise RowProblem("missing_column", key, "no such column", _suggest("data.data_source_key", key, row))
    source = row[key]
    if not isinstance(source, str) or not source:
        raise RowProblem("bad_data_source", key, f"expected a non-empty string, got {source!r}")
    truth = _ground_truth(row, cfg.ground_truth_key)
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise RowProblem("bad_extra_info", "extra_info", f"expected an object, got {type(extra).__name__}")
    agent = row.get("agent_name")
    if agent is not None and not isinstance(agent, str):
        raise RowProblem("bad_agent_name", "agent_name", f"expected a string, got {type(agent).__name__}")
    return CheckedRow(messages, source, truth, dict(extra or {}), agent)
