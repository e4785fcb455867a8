"""Tools declared in a YAML file, built once at start-up with errors that say where and how to fix.

    tools:
      - class: quartet.agents.tools.calculator:CalculatorTool   # module:Class (or module.Class)
        config: {max_digits: 50}                                # keyword arguments of the constructor
        schema:                                                 # optional when the class has a default
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, ...}}

verl's layout of the file (`class_name`, `config: {type: native}`, `tool_schema`) loads unchanged, verl's
classes mapped to quartet's equivalents (`quartet.agents.verl_compat`).

`load_tools(path)` returns the tools by name. Every mistake is a `ToolConfigError` naming the file, the
entry and the field, e.g. `tools.yaml: tools[1].class: cannot import module 'quartet.agents.tools.calc'
(...)`, and how to fix it: an unknown key or constructor argument suggests the closest known one, a bad
schema names the schema field, a duplicate tool name names both entries.

The loading and its wording are shared with the interactions file (`quartet.agents.yaml_registry`); what is
the tools' own is the schema. The class is imported from its dotted path, i.e. YAML can run any importable
code: load tool files you trust, as you would a Python module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quartet.agents.tools.base import Tool, ToolSchemaError
from quartet.agents.verl_compat import verl_tool_entry
from quartet.agents.yaml_registry import RegistrySpec, build_registry, construct, entry_config, read_yaml

__all__ = ["ToolConfigError", "build_tools", "load_tools"]


class ToolConfigError(ValueError):
    """A tools file that cannot be turned into tools; the message names file, entry, field and fix."""


_SPEC: RegistrySpec[Tool] = RegistrySpec(
    section="tools",
    kind="tool",
    base=Tool,
    base_path="quartet.agents.tools.base.Tool",
    error=ToolConfigError,
    entry_keys=("class", "config", "schema"),
    entry_options=("schema",),
    name_field="schema.function.name",
    name_fix="give each tool a unique name in its schema",
    verl_entry=verl_tool_entry,
)


def _build_one(entry: Mapping[str, Any], cls: type[Tool], where: str) -> Tool:
    config = entry_config(entry, cls, _SPEC, where)
    schema = entry.get("schema")

    def explain(exc: Exception) -> str | None:  # a bad schema is reported at its own field
        if not isinstance(exc, ToolSchemaError):
            return None
        source = "" if schema is not None else f" ({cls.__name__}'s default schema)"
        fix = "give a schema" if "no default schema" in exc.problem else "fix the schema"
        return f"{exc.field}: {exc.problem}{source}; {fix}"

    kwargs = config if schema is None else {**config, "schema": schema}
    return construct(cls, kwargs, _SPEC, where, explain)


def build_tools(data: object, source: str = "<tools>") -> dict[str, Tool]:
    """Tools by name from a parsed tools document (`{"tools": [...]}`) or its list of entries.

    `source` names the document in errors (`load_tools` passes the file path).
    """
    return build_registry(data, _SPEC, source, _build_one)


def load_tools(path: str | os.PathLike[str]) -> dict[str, Tool]:
    """Tools by name from a tools YAML file (module docstring); `ToolConfigError` on any mistake."""
    return build_tools(read_yaml(path, _SPEC), str(Path(path)))
