"""Tools declared in a YAML file, built once at start-up with errors that say where and how to fix.

    tools:
      - class: quartet.agents.tools.calculator:CalculatorTool   # module:Class (or module.Class)
        config: {max_digits: 50}                                # keyword arguments of the constructor
        schema:                                                 # optional when the class has a default
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, ...}}

`load_tools(path)` returns the tools by name. Every mistake is a `ToolConfigError` naming the file, the
entry and the field, e.g. `tools.yaml: tools[1].class: cannot import module 'quartet.agents.tools.calc'
(...)`, and how to fix it: an unknown key or constructor argument suggests the closest known one, a bad
schema names the schema field, a duplicate tool name names both entries.

The class is imported from its dotted path, i.e. YAML can run any importable code: load tool files you
trust, as you would a Python module.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from quartet.agents.tools.base import Tool, ToolSchemaError

__all__ = ["ToolConfigError", "build_tools", "load_tools"]

_ENTRY_KEYS = ("class", "config", "schema")


class ToolConfigError(ValueError):
    """A tools file that cannot be turned into tools; the message names file, entry, field and fix."""


def _hint(word: str, known: list[str]) -> str:
    match = difflib.get_close_matches(word, known, n=1)
    return f"; did you mean {match[0]!r}?" if match else ""


def _import_class(path: object) -> type[Tool]:
    """The Tool subclass at 'module:Class' or 'module.Class'; ValueError with the reason otherwise."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError("missing; write the tool class as 'package.module:ClassName'")
    path = path.strip()
    module_name, sep, class_name = path.partition(":")
    if not sep:
        module_name, _, class_name = path.rpartition(".")
    if not module_name or not class_name:
        raise ValueError(f"{path!r} is not 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or any error raised while importing the module
        raise ValueError(
            f"cannot import module {module_name!r} ({type(exc).__name__}: {exc}); check the module path"
        ) from None
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = [n for n, v in vars(module).items() if inspect.isclass(v) and issubclass(v, Tool)]
        raise ValueError(
            f"module {module_name!r} has no {class_name!r}{_hint(class_name, classes)}"
            f" (tool classes there: {', '.join(sorted(classes)) or 'none'})"
        )
    if not (inspect.isclass(cls) and issubclass(cls, Tool)) or inspect.isabstract(cls):
        raise ValueError(f"{path!r} is not a concrete subclass of quartet.agents.tools.base.Tool")
    return cls


def _check_config(cls: type[Tool], config: Mapping[str, Any]) -> str | None:
    """The first config key the constructor does not accept, as a message; None when all fit."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    accepted = [
        name
        for name, p in params.items()
        if name not in ("self", "schema")
        and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    for key in config:
        if key not in accepted:
            return (
                f"{cls.__name__} has no option {key!r}{_hint(str(key), accepted)}"
                f" (options: {', '.join(accepted) or 'none'})"
            )
    return None


def _build_one(entry: object, where: str) -> Tool:
    if not isinstance(entry, Mapping):
        raise ToolConfigError(f"{where}: expected a mapping with 'class' (and 'config', 'schema')")
    for key in entry:
        if key not in _ENTRY_KEYS:
            known = ", ".join(_ENTRY_KEYS)
            raise ToolConfigError(
                f"{where}.{key}: unknown key{_hint(str(key), list(_ENTRY_KEYS))}; known: {known}"
            )
    try:
        cls = _import_class(entry.get("class"))
    except ValueError as exc:
        raise ToolConfigError(f"{where}.class: {exc}") from None
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise ToolConfigError(f"{where}.config: expected a mapping of constructor options")
    problem = _check_config(cls, config)
    if problem:
        raise ToolConfigError(f"{where}.config: {problem}")
    schema = entry.get("schema")
    kwargs = dict(config) if schema is None else {**config, "schema": schema}
    try:
        return cls(**kwargs)
    except ToolSchemaError as exc:
        source = "" if schema is not None else f" ({cls.__name__}'s default schema)"
        fix = "give a schema" if "no default schema" in exc.problem else "fix the schema"
        raise ToolConfigError(f"{where}.{exc.field}: {exc.problem}{source}; {fix}") from None
    except Exception as exc:  # the constructor's own check of its options
        raise ToolConfigError(
            f"{where}.config: {cls.__name__}(...) failed: {type(exc).__name__}: {exc}"
        ) from None


def build_tools(data: object, source: str = "<tools>") -> dict[str, Tool]:
    """Tools by name from a parsed tools document (`{"tools": [...]}`); `source` names it in errors."""
    if not isinstance(data, Mapping) or "tools" not in data:
        raise ToolConfigError(f"{source}: expected a top-level 'tools:' list of tool entries")
    entries = data["tools"]
    if not isinstance(entries, list):
        raise ToolConfigError(f"{source}: tools: expected a list of entries (each '- class: ...')")
    tools: dict[str, Tool] = {}
    first_index: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{source}: tools[{index}]"
        tool = _build_one(entry, where)
        if tool.name in tools:
            raise ToolConfigError(
                f"{where}.schema.function.name: duplicate tool name {tool.name!r} (also "
                f"tools[{first_index[tool.name]}]); give each tool a unique name in its schema"
            )
        tools[tool.name] = tool
        first_index[tool.name] = index
    return tools


def load_tools(path: str | os.PathLike[str]) -> dict[str, Tool]:
    """Tools by name from a tools YAML file (module docstring); `ToolConfigError` on any mistake."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise ToolConfigError(f"{file}: cannot read the tools file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ToolConfigError(f"{file}: not valid YAML: {exc}") from None
    return build_tools(data, str(file))
