"""`response_format` and forced `tool_choice`: the grammar that constrains a chat response.

The built-in engine masks, at every step, the tokens a grammar forbids (`SamplingParams.grammar`,
`quartet.rollout.torch.grammar`); this module writes that grammar (llguidance's Lark dialect, with JSON
schemas embedded by `%json`) from the OpenAI fields:

- `response_format: {"type": "json_object"}`: one JSON object (any keys).
- `response_format: {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}`: one JSON value
  valid against `schema`. The schema is enforced whatever `strict` says (strict only adds guarantees).
- `tool_choice: "required"`: one or more Hermes tool-call blocks, `<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>` (the format the server's tool parser reads), each naming one of the tools, its
  arguments valid against that tool's `parameters`; with `parallel_tool_calls: false`, exactly one block.
- `tool_choice: {"type": "function", "function": {"name": X}}`: exactly one block calling X.

Numbers stay finite: an unbounded `number` is constrained as an integer or a bounded float
(`finite_numbers`), as llguidance would otherwise allow `1e999`, which Python reads as infinity.

JSON is written compactly (no free whitespace), so a response cannot pad itself with blanks until its token
limit. The response ends as soon as the grammar is complete (finish reason "stop", or "tool_calls" for
calls); a response cut by `max_tokens` first is incomplete, as with OpenAI. Schemas are compiled here, in a
worker thread, before anything reaches the engine: a schema llguidance cannot compile, or one with more than
`MAX_SCHEMA_PROPERTIES` properties in one object (which compiles but fails while decoding), is a 400 naming
the field (`response_format.json_schema.schema`, `tools[i].function.parameters`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quartet.serving.fields import bad, boolean, show
from quartet.serving.limits import MAX_SCHEMA_PROPERTIES
from quartet.serving.tool_calls import HERMES_TAGS

if TYPE_CHECKING:
    from llguidance import LLMatcher

__all__ = [
    "FLOAT_BOUND",
    "ToolPlan",
    "check_schema",
    "finite_numbers",
    "parse_response_format",
    "parse_tool_choice",
    "tool_grammar",
    "json_grammar",
]

_COMPACT = {"whitespace_flexible": False}


def _matcher() -> type[LLMatcher]:
    """llguidance's `LLMatcher`, imported on first use (its import takes ~0.3 s; few servers use it)."""
    from llguidance import LLMatcher

    return LLMatcher


def _check_properties(schema: dict[str, Any], param: str) -> None:
    """A 400 naming `param` when one object of `schema` declares more than `MAX_SCHEMA_PROPERTIES`.

    llguidance compiles such a schema but fails while decoding it (see `MAX_SCHEMA_PROPERTIES`), which
    would be an HTTP 500 in the middle of a request; refused up front instead.
    """
    stack: list[Any] = [schema]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            properties = item.get("properties")
            if isinstance(properties, dict) and len(properties) > MAX_SCHEMA_PROPERTIES:
                raise bad(
                    f"'{param}' declares {len(properties)} properties in one object; at most "
                    f"{MAX_SCHEMA_PROPERTIES} per object can be enforced (split the object or nest it)",
                    param,
                )
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def check_schema(schema: Any, param: str) -> dict[str, Any]:
    """`schema` if llguidance can compile and enforce it, else a 400 naming `param`."""
    LLMatcher = _matcher()  # noqa: N806
    if not isinstance(schema, dict):
        raise bad(f"'{param}' must be a JSON schema object, got {show(schema)}", param)
    _check_properties(schema, param)
    try:
        grammar = LLMatcher.grammar_from_json_schema(schema, overrides=_COMPACT)  # type: ignore[arg-type]
    except Exception as exc:  # llguidance raises ValueError, or others on odd input: all the caller's
        raise bad(f"'{param}' is not a usable JSON schema: {exc}", param) from None
    error = LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise bad(f"'{param}' is not a JSON schema this server can enforce: {error}", param)
    return schema


def parse_response_format(value: Any) -> dict[str, Any] | None:
    """The JSON schema the response must follow (None: free text), from a `response_format` field."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text" and set(value) == {"type"}:
        return None
    if kind == "json_object" and set(value) == {"type"}:
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if set(value) != {"type", "json_schema"} or not isinstance(spec, dict):
            raise bad(
                "'response_format.json_schema' must be an object {name, schema, strict}", "response_format"
            )
        unknown = sorted(set(spec) - {"name", "schema", "strict", "description"})
        if unknown:
            raise bad(
                f"unknown field '{unknown[0]}' in 'response_format.json_schema'",
                "response_format.json_schema",
            )
        if not isinstance(spec.get("name"), str) or not spec["name"]:
            raise bad(
                "'response_format.json_schema.name' must be a non-empty string",
                "response_format.json_schema.name",
            )
        boolean(spec, "strict", False, "response_format.json_schema.strict")
        return check_schema(spec.get("schema", {}), "response_format.json_schema.schema")
    raise bad(
        "'response_format' must be {'type': 'text'}, {'type': 'json_object'} or "
        f"{{'type': 'json_schema', 'json_schema': {{...}}}}, got {show(value)}",
        "response_format",
    )


FLOAT_BOUND = 1e15
"""Largest magnitude of a non-integer the grammar lets an unbounded `number` take (see `finite_numbers`)."""
_PLAIN_NUMBER_KEYS = {"type", "description", "title", "default", "examples"}
_DATA_KEYS = {"const", "enum", "default", "examples"}
"""Keywords whose values are JSON data, not schemas: left as they are."""


def finite_numbers(schema: Any) -> Any:
    """`schema` with every unbounded `{"type": "number"}` written so that its value is a finite float.

    llguidance lets a `number` take any exponent (`1e999`), which Python reads as infinity: no longer JSON
    (RFC 8259) once written back. Such a number becomes `anyOf` an integer (any digits: Python's ints do
    not overflow) and a number within +-`FLOAT_BOUND` (llguidance writes a bounded number without an
    exponent, so it cannot overflow either). Every finite float is still reachable, large ones as integers.
    Numbers with keywords beyond a description are left as written (tool_calls refuses a non-finite one).
    """
    if isinstance(schema, list):
        return [finite_numbers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") == "number" and set(schema) <= _PLAIN_NUMBER_KEYS:
        bounded = {"type": "number", "minimum": -FLOAT_BOUND, "maximum": FLOAT_BOUND}
        rest = {k: v for k, v in schema.items() if k != "type"}
        return {**rest, "anyOf": [{"type": "integer"}, bounded]}
    return {k: v if k in _DATA_KEYS else finite_numbers(v) for k, v in schema.items()}


def json_grammar(schema: Mapping[str, Any]) -> str:
    """The grammar of one compact JSON value valid against `schema` (numbers finite: `finite_numbers`)."""
    return _matcher().grammar_from_json_schema(finite_numbers(dict(schema)), overrides=_COMPACT)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ToolPlan:
    """What `tool_choice` and `parallel_tool_calls` ask of a chat response."""

    parse: bool
    """Turn the output's Hermes blocks into `tool_calls` (tools given, tool_choice not "none")."""
    forced: tuple[dict[str, Any], ...] = ()
    """The functions one of which every call must name (tool_choice "required" or a named function);
    empty: the model may write prose (no constraint)."""
    single: bool = False
    """At most one call: `parallel_tool_calls: false` (constrained when forced, else cut to the first)."""


def _named(choice: Mapping[str, Any], tools: Sequence[dict[str, Any]], where: str) -> dict[str, Any]:
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else choice.get("name")
    if choice.get("type") != "function" or not isinstance(name, str):
        raise bad(
            f"'{where}' must be 'none', 'auto', 'required' or "
            "{'type': 'function', 'function': {'name': ...}}",
            where,
        )
    for tool in tools:
        if tool["function"]["name"] == name:
            return dict(tool["function"])
    known = sorted(t["function"]["name"] for t in tools)
    raise bad(f"'{where}' names the function {show(name)}, which is not among the tools {known}", where)


def parse_tool_choice(
    choice: Any, parallel: Any, tools: Sequence[dict[str, Any]] | None, where: str = "tool_choice"
) -> ToolPlan:
    """The `ToolPlan` of a body's `tool_choice` and `parallel_tool_calls` (400s name the field)."""
    single = not boolean({"p": parallel}, "p", True, "parallel_tool_calls")
    if choice in (None, "auto", "none"):
        return ToolPlan(parse=tools is not None and choice != "none", single=single)
    if not tools:
        raise bad(f"'{where}' forces a tool call, but the request has no 'tools'", where)
    if choice == "required":
        forced = tuple(dict(t["function"]) for t in tools)
    elif isinstance(choice, dict):
        forced = (_named(choice, tools, where),)
        single = True
    else:
        raise bad(
            f"'{where}' must be 'none', 'auto', 'required' or a named function, got {show(choice)}", where
        )
    names = {f["name"] for f in forced}
    for i, tool in enumerate(tools):
        if tool["function"]["name"] in names:
            parameters = tool["function"].get("parameters") or {"type": "object"}
            check_schema(parameters, f"tools[{i}].function.parameters")
    return ToolPlan(parse=True, forced=forced, single=single)


def _tag(text: str, tag_ids: Mapping[int, str]) -> str:
    """A tag in the grammar: its token (`<[id]>`) when the tokenizer holds it as one, else its text."""
    for token_id, tag in tag_ids.items():
        if tag == text:
            return f"<[{token_id}]>"
    return json.dumps(text)


def tool_grammar(plan: ToolPlan, tag_ids: Mapping[int, str]) -> str:
    """The grammar of the Hermes tool-call blocks `plan` forces (see the module docstring)."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": finite_numbers(f.get("parameters") or {"type": "object"}),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in plan.forced
    ]
    schema = {"x-guidance": _COMPACT, "anyOf": calls}
    open_tag, close_tag = (_tag(t, tag_ids) for t in HERMES_TAGS)
    start = "start: call\n" if plan.single else 'start: call ("\\n" call)*\n'
    call = f'call: {open_tag} "\\n" %json {json.dumps(schema)} "\\n" {close_tag}\n'
    return _matcher().grammar_from_lark(start + call)
