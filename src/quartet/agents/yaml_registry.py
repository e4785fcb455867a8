"""The YAML loader behind the tools file and the interactions file: one design, written once.

Both files are a top-level list of entries, each naming a class by dotted path plus its constructor options:

    tools:                                             interactions:
      - class: package.module:ToolClass                  - class: package.module:InteractionClass
        config: {option: value}                              config: {option: value}
        schema: {...}                                        name: my_game

verl's layout of the same files (`class_name`, `tool_schema`, a top-level `interaction:`) is read too: an
entry with `class_name` goes through the spec's `verl_entry` first (`quartet.agents.verl_compat`).

A `RegistrySpec` says what differs (the section and entry keys, the base class, the error type, where an
object's name comes from); this module does the rest and words every mistake the same way:
`<file>: <section>[<index>].<field>: <problem>; <fix>`. An unknown key or option suggests the closest known
one, a class that cannot be imported says why, a duplicate name names both entries. Each registry keeps
only what is its own (`quartet.agents.tools.registry`: the schema; `quartet.agents.interaction_registry`:
the name). The class is imported from its dotted path, i.e. YAML can run any importable code: load files
you trust, as you would a Python module.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeGuard, TypeVar

import yaml

__all__ = ["RegistrySpec", "build_registry", "construct", "entry_config", "hint", "read_yaml"]


class _Named(Protocol):
    @property
    def name(self) -> str: ...


T = TypeVar("T", bound=_Named)


@dataclass(frozen=True)
class RegistrySpec(Generic[T]):
    """What one registry file holds; the shared loader words its errors from these fields."""

    section: str
    """The top-level key and the prefix of entry paths in errors: 'tools' gives `tools[2].class`."""
    kind: str
    """The object's kind in messages: 'tool' gives "write the tool class as ...", "duplicate tool name"."""
    base: type
    """Every entry's class must be a concrete subclass of it (of T: `type`, as T is usually abstract)."""
    base_path: str
    """`base`'s import path, as errors show it."""
    error: type[ValueError]
    """Raised for every mistake, with the message `file: entry.field: problem; fix`."""
    entry_keys: tuple[str, ...]
    """The keys an entry may have ('class' first)."""
    entry_options: tuple[str, ...]
    """Constructor arguments an entry key sets (a tool's 'schema'); refused inside `config`."""
    name_field: str
    """The entry field a duplicate name is reported at ('name', 'schema.function.name')."""
    name_fix: str
    """How to fix a duplicate name."""
    verl_section: str = ""
    """verl's top-level key of the same file, when it differs from `section` ('interaction')."""
    verl_entry: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    """Turns an entry in verl's layout (it has `class_name`) into quartet's; ValueError("<field>: ...")."""


def hint(word: str, known: Iterable[str]) -> str:
    """ "; did you mean 'x'?" for the known word closest to `word`, or "" when none is close."""
    match = difflib.get_close_matches(word, list(known), n=1)
    return f"; did you mean {match[0]!r}?" if match else ""


def read_yaml(path: str | os.PathLike[str], spec: RegistrySpec[T]) -> object:
    """The parsed document in `path`; `spec.error` naming the file when it cannot be read or parsed."""
    file = Path(path)
    try:
        return yaml.safe_load(file.read_text())
    except OSError as exc:
        raise spec.error(
            f"{file}: cannot read the {spec.section} file ({exc.strerror}); check the path"
        ) from None
    except yaml.YAMLError as exc:
        raise spec.error(f"{file}: not valid YAML: {exc}") from None


def build_registry(
    data: object,
    spec: RegistrySpec[T],
    source: str,
    build_one: Callable[[Mapping[str, Any], type[T], str], T],
) -> dict[str, T]:
    """Objects by name from a parsed document (`{section: [...]}`) or its bare list of entries.

    Checks the document and each entry's keys and class, then calls `build_one(entry, cls, where)` for the
    registry's own part (options, name, schema); `where` prefixes its errors. `source` names the document.
    """
    entries = _entries(data, spec, source)
    built: dict[str, T] = {}
    first_index: dict[str, int] = {}
    for index, raw in enumerate(entries):
        where = f"{source}: {spec.section}[{index}]"
        if spec.verl_entry is not None and isinstance(raw, Mapping) and "class_name" in raw:
            try:
                raw = spec.verl_entry(raw)
            except ValueError as exc:  # chained: a caller may read the cause's own `fix`
                raise spec.error(f"{where}.{exc}") from exc
        entry = _checked_entry(raw, spec, where)
        try:
            cls = _import_class(entry.get("class"), spec)
        except ValueError as exc:
            raise spec.error(f"{where}.class: {exc}") from None
        item = build_one(entry, cls, where)
        if item.name in built:
            raise spec.error(
                f"{where}.{spec.name_field}: duplicate {spec.kind} name {item.name!r} (also "
                f"{spec.section}[{first_index[item.name]}]); {spec.name_fix}"
            )
        built[item.name] = item
        first_index[item.name] = index
    return built


def entry_config(entry: Mapping[str, Any], cls: type[T], spec: RegistrySpec[T], where: str) -> dict[str, Any]:
    """The entry's `config` (constructor options), checked against the constructor's keyword arguments."""
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise spec.error(f"{where}.config: expected a mapping of constructor options")
    problem = _config_problem(cls, config, spec.entry_options)
    if problem:
        raise spec.error(f"{where}.config: {problem}")
    return {str(key): value for key, value in config.items()}


def construct(
    cls: type[T],
    kwargs: Mapping[str, Any],
    spec: RegistrySpec[T],
    where: str,
    explain: Callable[[Exception], str | None] | None = None,
) -> T:
    """`cls(**kwargs)`; a constructor's refusal becomes `spec.error` at `where.config`.

    explain(exc): the registry's own message (field included, after `where.`) for errors it knows better,
    or None to use the generic one.
    """
    try:
        return cls(**kwargs)
    except Exception as exc:  # the constructor's own check of its options
        message = explain(exc) if explain is not None else None
        if message is None:
            message = f"config: {cls.__name__}(...) failed: {type(exc).__name__}: {exc}"
        raise spec.error(f"{where}.{message}") from None


def _entries(data: object, spec: RegistrySpec[T], source: str) -> list[object]:
    if isinstance(data, Mapping):
        sections = (spec.section, spec.verl_section) if spec.verl_section else (spec.section,)
        for key in data:
            if key not in sections:
                raise spec.error(
                    f"{source}: {key}: unknown top-level key{hint(str(key), sections)}; "
                    f"known: {', '.join(sections)}"
                )
        if len(data) > 1:
            raise spec.error(f"{source}: both {' and '.join(sections)}; keep one list of entries")
        data = next(iter(data.values()), None)
    if not isinstance(data, list):
        raise spec.error(
            f"{source}: {spec.section}: expected a top-level '{spec.section}:' list of entries"
            " (each '- class: ...')"
        )
    return data


def _checked_entry(entry: object, spec: RegistrySpec[T], where: str) -> Mapping[str, Any]:
    if not isinstance(entry, Mapping):
        others = ", ".join(repr(key) for key in spec.entry_keys if key != "class")
        raise spec.error(f"{where}: expected a mapping with 'class' (and {others})")
    for key in entry:
        if key not in spec.entry_keys:
            raise spec.error(
                f"{where}.{key}: unknown key{hint(str(key), spec.entry_keys)}; "
                f"known: {', '.join(spec.entry_keys)}"
            )
    return entry


def _import_class(path: object, spec: RegistrySpec[T]) -> type[T]:
    """The concrete subclass of `spec.base` at 'module:Class' or 'module.Class'; ValueError saying why not."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"missing; write the {spec.kind} class as 'package.module:ClassName'")
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

    def is_subclass(value: object) -> TypeGuard[type[T]]:
        return inspect.isclass(value) and issubclass(value, spec.base)

    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(
            name for name, value in vars(module).items() if is_subclass(value) and value is not spec.base
        )
        raise ValueError(
            f"module {module_name!r} has no {class_name!r}{hint(class_name, found)}"
            f" ({spec.kind} classes there: {', '.join(found) or 'none'})"
        )
    if not is_subclass(cls) or inspect.isabstract(cls):
        raise ValueError(f"{path!r} is not a concrete subclass of {spec.base_path}; point to one")
    return cls


def _config_problem(cls: type[Any], config: Mapping[Any, Any], entry_options: tuple[str, ...]) -> str | None:
    """The first config key the constructor does not accept, as a message; None when all fit."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = None  # the constructor takes any keyword; it checks them itself
    else:
        accepted = [
            key
            for key, p in params.items()
            if key != "self"
            and key not in entry_options
            and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
    for key in config:
        if key in entry_options:
            return f"{key!r} is not a config option; set it as the entry's own '{key}:' key"
        if accepted is not None and key not in accepted:
            return (
                f"{cls.__name__} has no option {key!r}{hint(str(key), accepted)}"
                f" (options: {', '.join(accepted) or 'none'})"
            )
    return None
