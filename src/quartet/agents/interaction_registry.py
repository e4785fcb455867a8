"""Interactions declared in a YAML file, built once at start-up with errors that say where and how to fix.

    interactions:
      - class: quartet.agents.interactions.guessing:GuessingGameInteraction   # module:Class (or module.Class)
        name: guessing_game          # optional; the class's `default_name` otherwise
        config: {max_guesses: 6}     # keyword arguments of the constructor

`load_interactions(path)` returns the interactions by name. Every mistake is an `InteractionConfigError`
naming the file, the entry and the field, e.g. `interactions.yaml: interactions[1].config: GuessingGame-
Interaction has no option 'max_guess'; did you mean 'max_guesses'? (options: max_guesses)`: an unknown key
or option suggests the closest known one, a class that cannot be imported says why, a duplicate name names
both entries.

The same design as the tools file (`quartet.agents.tools.registry`), written separately so each registry
knows its own base class, keys and wording. The class is imported from its dotted path, i.e. YAML can run
any importable code: load interaction files you trust, as you would a Python module.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from quartet.agents.interaction import Interaction, InteractionError, check_name

__all__ = ["InteractionConfigError", "build_interactions", "load_interactions"]

_TOP_KEYS = ("interactions",)
_ENTRY_KEYS = ("class", "name", "config")
_BASE = "quartet.agents.interaction.Interaction"


class InteractionConfigError(ValueError):
    """An interactions file that cannot be turned into interactions; names file, entry, field and fix."""


def _hint(word: str, known: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, list(known), n=1)
    return f"; did you mean {match[0]!r}?" if match else ""


def _is_interaction(value: object) -> TypeGuard[type[Interaction]]:
    return inspect.isclass(value) and issubclass(value, Interaction)


def _import_class(path: object) -> type[Interaction]:
    """The concrete Interaction subclass at 'module:Class' or 'module.Class'; ValueError saying why not."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError("missing; write the interaction class as 'package.module:ClassName'")
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
        found = sorted(n for n, v in vars(module).items() if _is_interaction(v) and v is not Interaction)
        raise ValueError(
            f"module {module_name!r} has no {class_name!r}{_hint(class_name, found)}"
            f" (interaction classes there: {', '.join(found) or 'none'})"
        )
    if not _is_interaction(cls) or inspect.isabstract(cls):
        raise ValueError(f"{path!r} is not a concrete subclass of {_BASE}; point to one")
    return cls


def _check_config(cls: type[Interaction], config: Mapping[Any, Any]) -> str | None:
    """The first config key the constructor does not accept, as a message; None when all fit."""
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        accepted = None  # the constructor takes any keyword; it checks them itself
    else:
        accepted = [
            key
            for key, p in params.items()
            if key not in ("self", "name")
            and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        ]
    for key in config:
        if key == "name":
            return "'name' is not a config option; set it as the entry's own 'name:' key"
        if accepted is not None and key not in accepted:
            return (
                f"{cls.__name__} has no option {key!r}{_hint(str(key), accepted)}"
                f" (options: {', '.join(accepted) or 'none'})"
            )
    return None


def _build_one(entry: object, where: str) -> Interaction:
    if not isinstance(entry, Mapping):
        raise InteractionConfigError(f"{where}: expected a mapping with 'class' (and 'name', 'config')")
    for key in entry:
        if key not in _ENTRY_KEYS:
            raise InteractionConfigError(
                f"{where}.{key}: unknown key{_hint(str(key), _ENTRY_KEYS)}; known: {', '.join(_ENTRY_KEYS)}"
            )
    try:
        cls = _import_class(entry.get("class"))
    except ValueError as exc:
        raise InteractionConfigError(f"{where}.class: {exc}") from None
    if "name" in entry:
        name, source = entry["name"], ""
    else:
        name, source = getattr(cls, "default_name", None), f" ({cls.__name__}.default_name)"
    try:
        check_name(name)
    except InteractionError as exc:
        fix = "give the entry a 'name:'" if source else "fix the name"
        raise InteractionConfigError(f"{where}.name: {exc}{source}; {fix}") from None
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise InteractionConfigError(f"{where}.config: expected a mapping of constructor options")
    problem = _check_config(cls, config)
    if problem:
        raise InteractionConfigError(f"{where}.config: {problem}")
    try:
        return cls(**{str(k): v for k, v in config.items()}, name=name)
    except Exception as exc:  # the constructor's own check of its options
        raise InteractionConfigError(
            f"{where}.config: {cls.__name__}(...) failed: {type(exc).__name__}: {exc}"
        ) from None


def build_interactions(entries: object, source: str = "<interactions>") -> dict[str, Interaction]:
    """Interactions by name from a parsed document (`{"interactions": [...]}`) or its list of entries.

    `source` names the document in errors (`load_interactions` passes the file path).
    """
    if isinstance(entries, Mapping):
        for key in entries:
            if key not in _TOP_KEYS:
                raise InteractionConfigError(
                    f"{source}: {key}: unknown top-level key{_hint(str(key), _TOP_KEYS)}; known: interactions"
                )
        entries = entries.get("interactions")
    if not isinstance(entries, list):
        raise InteractionConfigError(
            f"{source}: interactions: expected a top-level 'interactions:' list of entries"
            " (each '- class: ...')"
        )
    built: dict[str, Interaction] = {}
    first_index: dict[str, int] = {}
    for index, entry in enumerate(entries):
        where = f"{source}: interactions[{index}]"
        interaction = _build_one(entry, where)
        if interaction.name in built:
            raise InteractionConfigError(
                f"{where}.name: duplicate interaction name {interaction.name!r} (also "
                f"interactions[{first_index[interaction.name]}]); give each entry a unique 'name:'"
            )
        built[interaction.name] = interaction
        first_index[interaction.name] = index
    return built


def load_interactions(path: str | os.PathLike[str]) -> dict[str, Interaction]:
    """Interactions by name from a YAML file (module docstring); `InteractionConfigError` on any mistake."""
    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text())
    except OSError as exc:
        raise InteractionConfigError(
            f"{file}: cannot read the interactions file ({exc.strerror}); check the path"
        ) from None
    except yaml.YAMLError as exc:
        raise InteractionConfigError(f"{file}: not valid YAML: {exc}") from None
    return build_interactions(data, str(file))
