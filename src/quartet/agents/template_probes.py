"""Probe conversations for the chat-template check (`quartet.agents.template_check`).

A probe is a prompt followed by model turns, each answered by environment messages (tool results, a
simulated user). For every model turn it says what the model wrote (`raw`, the text the engine's tokens
spell, without the end-of-turn token) and how the conversation keeps that turn in its history (`message`).
Those two differ on purpose in the probes that mimic an OpenAI-compatible client: the client keeps a
tool call as structured `tool_calls` and a reasoning block as `reasoning_content`, so the template renders
them back in its own spelling. quartet's agent loops keep the decoded text as `content` (the `loop` form).
A tool result carries its call's `name` and `tool_call_id` (`PROBE_CALL_ID`, also the structured call's
`id`), as the tool loop and OpenAI clients send it: templates such as Hermes' refuse a tool message
without `name`.

The model's tool-call text is taken from the template itself (its wrapper around the call, e.g.
`<tool_call>\\n...\\n</tool_call>`), with the JSON written as a model writes it: `name` first, the
arguments in the order given, `json.dumps` spacing. A template that re-spells the call (sorted keys, other
whitespace) then shows up as a break; a template that renders what the model wrote does not.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "PROBE_CALL_ID",
    "PROBE_TOOLS",
    "ModelTurn",
    "Probe",
    "model_tool_call_text",
    "row_probes",
    "standard_probes",
]

PROBE_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "the expression"},
                    "digits": {"type": "integer", "description": "digits after the point"},
                },
                "required": ["expression"],
            },
        },
    }
]
"""The tools of the standard probes: one function whose argument names are not in sorted order."""

_REASONING = ("First add the two numbers.", "The tool said 5, so that is the answer.", "Go one higher.")
_MARK = "\u2063quartet-probe\u2063"


@dataclass(frozen=True)
class ModelTurn:
    """One model turn: what the model wrote, and the history message that stands for it."""

    raw: str
    message: dict[str, Any]
    reasoning: str = ""
    """The reasoning text inside `raw` (between `<think>` tags), "" without one."""
    tool_call: str = ""
    """The tool-call text inside `raw`, "" without one."""


@dataclass(frozen=True)
class Probe:
    """A prompt, then model turns each answered by `env[i]` (the last answer may be empty)."""

    name: str
    prompt: list[dict[str, Any]]
    turns: list[ModelTurn]
    env: list[list[dict[str, Any]]]
    tools: list[dict[str, Any]] | None = field(default=None)


def _think(reasoning: str) -> str:
    return f"<think>\n{reasoning}\n</think>\n\n"


def _call_arguments(tool: dict[str, Any]) -> dict[str, Any]:
    """Arguments for a probe call to `tool`: its properties in schema order, a plausible value each."""
    props = tool.get("function", tool).get("parameters", {}).get("properties", {})
    kinds = {"integer": 2, "number": 2.5, "boolean": True}
    args = {name: kinds.get(str(spec.get("type")), "2 + 3") for name, spec in props.items()}
    return args or {}


def model_tool_call_text(render: Any, tool: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The text a model writes to call `tool` (the template's wrapper around `json.dumps` of the call) and
    the structured `tool_calls` entry an OpenAI client keeps for it.

    `render(messages)` renders without a generation prompt. The wrapper is what the template writes for the
    structured call after empty content, from where a (marked) content would start; without one found, the
    Hermes form is used.
    """
    name = str(tool.get("function", tool)["name"])
    args = _call_arguments(tool)
    written = json.dumps({"name": name, "arguments": args})
    structured = {"id": PROBE_CALL_ID, "type": "function", "function": {"name": name, "arguments": args}}
    hermes = f"<tool_call>\n{written}\n</tool_call>"
    user = {"role": "user", "content": "u"}
    try:  # where the assistant's content starts, then the call rendered after empty content
        after = str(render([user, {"role": "assistant", "content": _MARK}])).find(_MARK)
        text = str(render([user, _with_calls("", [structured])]))
    except Exception:  # noqa: BLE001 - a template that cannot render structured calls: Hermes then
        return hermes, structured
    decoder = json.JSONDecoder()
    start = text.find("{", after)
    while after >= 0 and start >= 0:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict) and name in json.dumps(obj):
            return text[after:start] + written + _tail_of_call(text[end:]), structured
        start = text.find("{", end)
    return hermes, structured


def _tail_of_call(rest: str) -> str:
    """What the template writes after a call's JSON up to the end of the call (e.g. `\\n</tool_call>`):
    up to and including the first `>`, or nothing when the call is not closed by a tag."""
    close = rest.find(">")
    opened = rest.find("<")
    return rest[: close + 1] if 0 <= opened < close and close < 40 else ""


def _with_calls(content: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": calls}


PROBE_CALL_ID = "call_0_0"
"""The id of a probe's tool call, as quartet's tool loop numbers a first turn's first call."""


def _tool_reply(content: str, name: str) -> list[dict[str, Any]]:
    """The tool message answering the probe's call, with the call's `name` and `tool_call_id` as quartet's
    loop and OpenAI clients send them (templates such as Hermes' refuse a tool message without `name`)."""
    return [{"role": "tool", "name": name, "tool_call_id": PROBE_CALL_ID, "content": content}]


def _user(content: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": content}]


def _turn(raw: str, message: dict[str, Any] | None = None, reasoning: str = "", call: str = "") -> ModelTurn:
    return ModelTurn(raw, message or {"role": "assistant", "content": raw}, reasoning, call)


def _tool_turns(
    call: str, structured: dict[str, Any], think: bool, loop_form: bool, reasoning_field: bool = False
) -> list[ModelTurn]:
    """A call, then the answer; with or without reasoning; kept as text (the loop's form) or as an OpenAI
    client keeps it (structured `tool_calls`; reasoning as `reasoning_content` where the template reads it,
    `reasoning_field`, else left in the content)."""
    r0, r1 = (_REASONING[0], _REASONING[1]) if think else ("", "")
    pre0, pre1 = (_think(r0), _think(r1)) if think else ("", "")
    answer = "The answer is 5."
    if loop_form:
        return [_turn(pre0 + call, reasoning=r0, call=call), _turn(pre1 + answer, reasoning=r1)]
    first: dict[str, Any] = _with_calls(pre0, [structured])
    second: dict[str, Any] = {"role": "assistant", "content": pre1 + answer}
    if think and reasoning_field:
        first = {**_with_calls("", [structured]), "reasoning_content": r0}
        second = {"role": "assistant", "content": answer, "reasoning_content": r1}
    return [_turn(pre0 + call, first, r0, call), _turn(pre1 + answer, second, r1)]


def _chat_turns(think: bool, reasoning_field: bool) -> list[ModelTurn]:
    """Three guesses of a guessing game, each answered by a simulated user."""
    out = []
    for guess in ("My guess is 4.", "My guess is 6.", "My guess is 5."):
        r = _REASONING[2] if think else ""
        raw = (_think(r) if think else "") + guess
        message = {"role": "assistant", "content": guess, "reasoning_content": r} if reasoning_field else None
        out.append(_turn(raw, message, reasoning=r))
    return out


def standard_probes(render_with_tools: Any, reasoning_field: bool) -> list[Probe]:
    """The probes of `quartet check template`: tool loops and user turns, with and without reasoning, with
    and without a system prompt; tool calls and reasoning kept as text (quartet's loop) and structured (an
    OpenAI client); `reasoning_content` only where the template reads it (`reasoning_field`)."""
    call, structured = model_tool_call_text(render_with_tools, PROBE_TOOLS[0])
    question = _user("What is 2 + 3? Use the calculator.")
    game = _user("Guess my number between 1 and 9.")
    users = [_user("Higher."), _user("Lower."), []]
    bodies: list[tuple[str, list[dict[str, Any]], list[ModelTurn], list[list[dict[str, Any]]], bool]] = []
    for think in (False, True):
        tag = "think_" if think else ""
        for loop_form in (True, False):
            form = "text" if loop_form else "structured"
            turns = _tool_turns(call, structured, think, loop_form, reasoning_field)
            reply = _tool_reply("5", PROBE_TOOLS[0]["function"]["name"])
            bodies.append((f"{tag}tool_call_{form}", question, turns, [reply, []], True))
        bodies.append((f"{tag}user_turns", game, _chat_turns(think, False), users, False))
    if reasoning_field:
        bodies.append(("reasoning_content_user_turns", game, _chat_turns(True, True), users, False))
    probes = []
    system = [{"role": "system", "content": "You are a careful assistant."}]
    for name, prompt, turns, env, tools in bodies:
        for with_system in (False, True):
            probes.append(
                Probe(
                    name + ("+system" if with_system else ""),
                    (system if with_system else []) + prompt,
                    turns,
                    env,
                    PROBE_TOOLS if tools else None,
                )
            )
    return probes


def row_probes(
    rows: Sequence[list[dict[str, Any]]],
    render_with_tools: Any,
    tools: list[dict[str, Any]] | None,
    user_turns: bool,
) -> list[Probe]:
    """Probes on a run's own first conversations, in the form quartet's loops keep history (text): each
    row's prompt, a model turn with reasoning (and a call to the run's first tool, if it has tools) and its
    answer; with a simulated user (`user_turns`), two more turns each answered by a user message."""
    probes = []
    for i, prompt in enumerate(rows):
        turns: list[ModelTurn] = []
        env: list[list[dict[str, Any]]] = []
        if tools:
            call, structured = model_tool_call_text(render_with_tools, tools[0])
            turns += _tool_turns(call, structured, think=True, loop_form=True)
            env += [
                _tool_reply("5", str(structured["function"]["name"])),
                _user("Go on.") if user_turns else [],
            ]
        if user_turns:
            turns += _chat_turns(think=True, reasoning_field=False)[:2]
            env += [_user("Higher."), []]
        if not turns:
            turns, env = [_turn(_think(_REASONING[0]) + "Done.", reasoning=_REASONING[0])], [[]]
        probes.append(Probe(f"row{i}", [dict(m) for m in prompt], turns, env, tools or None))
    return probes
