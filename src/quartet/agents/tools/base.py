"""The tool interface: an async `Tool` with per-trajectory instances, and the `ToolResult` it returns.

A tool is declared to the model by an OpenAI function-tool schema,

    {"type": "function", "function": {"name": ..., "description": ..., "parameters": <JSON schema>}}

given to the constructor or, as a default, set as the class attribute `schema`. The schema is checked once,
when the tool is built (`check_schema`), so a typo fails at start-up, not in the middle of a rollout.

Lifecycle, one instance per trajectory (the shape verl's `BaseTool` users know):

    instance_id = await tool.create(**create_kwargs)         # per-trajectory state (e.g. the ground truth)
    result = await tool.execute(instance_id, arguments)      # any number of times, possibly concurrently
    reward = await tool.calc_reward(instance_id)             # optional; 0.0 by default
    await tool.release(instance_id)

`execute` must not block the event loop: many trajectories share it. Do blocking work in a subprocess or
with `asyncio.to_thread`. Arguments reach `execute` already validated against the schema's `parameters`
by the executor (`quartet.agents.tools.executor`), which also turns exceptions and timeouts into results.
"""

from __future__ import annotations

import copy
import difflib
import re
import uuid
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # installed with Ray; no stubs in the environment
import jsonschema.exceptions  # type: ignore[import-untyped]

__all__ = ["Tool", "ToolResult", "ToolSchemaError", "check_schema"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


@dataclass
class ToolResult:
    """What one tool call gives back to the conversation."""

    text: str
    """The tool message shown to the model (an error message for the model when the call failed)."""
    reward: float | None = None
    """A reward for this call alone, when the tool gives one: it goes to the model turn that made the call
    (turn-level credit, algorithm.turn_reward_coef); the trajectory's reward comes from `calc_reward`."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-call numbers for logging (e.g. a program's CPU seconds)."""
    error: str | None = None
    """Set when the call failed: bad arguments, an exception, a timeout, a limit hit. None on success."""
    images: tuple[bytes, ...] = ()
    """Encoded images (PNG, JPEG, ... bytes) the tool shows the model: the tool message becomes `text`
    followed by one image content part per image (a vision-language model only; a text model's loop
    drops them and counts `tool/images_dropped`)."""


class ToolSchemaError(ValueError):
    """A tool schema that is not a valid OpenAI function-tool schema; `field` is the dotted path at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def _closest(word: str, known: tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, known, n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def check_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of `schema` once it is a valid function-tool schema; else `ToolSchemaError`.

    Checked: `type: function`; `function.name` of 1-64 letters, digits, `_` or `-` (OpenAI's rule);
    `function.description` a string; `function.parameters` an object-typed, valid JSON schema (Draft
    2020-12 meta-schema); no unknown keys under `function`. A missing `parameters` means "no arguments".
    """
    if not isinstance(schema, Mapping):
        raise ToolSchemaError("schema", f"expected a mapping, got {type(schema).__name__}")
    if schema.get("type") != "function":
        raise ToolSchemaError("schema.type", f"must be 'function', got {schema.get('type')!r}")
    function = schema.get("function")
    if not isinstance(function, Mapping):
        raise ToolSchemaError("schema.function", "missing or not a mapping with name/description/parameters")
    for key in function:
        if key not in _FUNCTION_KEYS:
            raise ToolSchemaError(
                f"schema.function.{key}",
                f"unknown key{_closest(str(key), _FUNCTION_KEYS)}; known: {', '.join(_FUNCTION_KEYS)}",
            )
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolSchemaError(
            "schema.function.name", f"must be 1-64 letters, digits, '_' or '-', got {name!r}"
        )
    if not isinstance(function.get("description", ""), str):
        raise ToolSchemaError("schema.function.description", "must be a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
        raise ToolSchemaError(
            "schema.function.parameters", "must be a JSON schema with `type: object` (the arguments)"
        )
    try:
        jsonschema.Draft202012Validator.check_schema(dict(parameters))
    except jsonschema.exceptions.SchemaError as exc:
        where = ".".join(str(p) for p in exc.path)
        raise ToolSchemaError(
            "schema.function.parameters" + (f".{where}" if where else ""),
            f"invalid JSON schema: {exc.message}",
        ) from None
    checked = copy.deepcopy(dict(schema))
    checked["function"] = {**copy.deepcopy(dict(function)), "parameters": copy.deepcopy(dict(parameters))}
    return checked


class Tool(ABC):
    """An async tool the model can call (see the module docstring for the lifecycle).

    Subclasses implement `execute`, may set a default `schema` as a class attribute, and call
    `super().__init__(schema=schema)` from their constructor, whose keyword arguments are the `config`
    of the tools YAML file (`quartet.agents.tools.registry`).
    """

    schema: dict[str, Any]
    """The checked OpenAI function-tool schema (a class attribute gives the default)."""
    instances: dict[str, dict[str, Any]]
    """Per-trajectory state by instance id; `create` stores its `tools_kwargs` here."""
    wants_images: bool = False
    """True for a tool that works on the prompt's images: the loop passes them to `create` as `images`
    (a list of encoded images, in prompt order; empty for a row without images)."""

    def __init__(self, *, schema: Mapping[str, Any] | None = None) -> None:
        chosen = schema if schema is not None else getattr(type(self), "schema", None)
        if chosen is None:
            raise ToolSchemaError("schema", f"{type(self).__name__} has no default schema; give one")
        self.schema = check_schema(chosen)
        self._validator = jsonschema.Draft202012Validator(self.parameters)
        self.instances = {}

    @property
    def name(self) -> str:
        """The function name the model calls."""
        return str(self.schema["function"]["name"])

    @property
    def description(self) -> str:
        return str(self.schema["function"].get("description", ""))

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments."""
        params: dict[str, Any] = self.schema["function"]["parameters"]
        return params

    def arguments_error(self, arguments: Mapping[str, Any]) -> str | None:
        """None when `arguments` fit the schema's `parameters`; else a one-line reason for the model."""
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(dict(arguments)))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path)
        return f"{where}: {error.message}" if where else error.message

    async def create(self, instance_id: str | None = None, **tools_kwargs: Any) -> str:
        """Start a per-trajectory instance holding `tools_kwargs`; returns its id (a new uuid if None)."""
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = dict(tools_kwargs)
        return instance_id

    @abstractmethod
    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call with schema-valid `arguments`."""

    async def calc_reward(self, instance_id: str) -> float:
        """The instance's reward for the trajectory; 0.0 unless a tool scores."""
        return 0.0

    async def release(self, instance_id: str) -> None:
        """Forget the instance's state (idempotent)."""
        self.instances.pop(instance_id, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
