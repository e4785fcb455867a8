"""Interactions declared in a YAML file, built once at start-up with errors that say where and how to fix.

    interactions:
      - class: quartet.agents.interactions.guessing:GuessingGameInteraction   # module:Class (or module.Class)
        name: guessing_game          # optional; the class's `default_name` otherwise
        config: {max_guesses: 6}     # keyword arguments of the constructor

verl's layout of the file (a top-level `interaction:` list, entries with `name`, `class_name`, `config`)
loads unchanged, verl's classes mapped to quartet's equivalents (`quartet.agents.verl_compat`).

`load_interactions(path)` returns the interactions by name. Every mistake is an `InteractionConfigError`
naming the file, the entry and the field, e.g. `interactions.yaml: interactions[1].config: GuessingGame-
Interaction has no option 'max_guess'; did you mean 'max_guesses'? (options: max_guesses)`: an unknown key
or option suggests the closest known one, a class that cannot be imported says why, a duplicate name names
both entries.

The loading and its wording are shared with the tools file (`quartet.agents.yaml_registry`); what is the
interactions' own is the name. The class is imported from its dotted path, i.e. YAML can run any importable
code: load interaction files you trust, as you would a Python module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quartet.agents.interaction import Interaction, InteractionError, check_name
from quartet.agents.verl_compat import verl_interaction_entry
from quartet.agents.yaml_registry import RegistrySpec, build_registry, construct, entry_config, read_yaml

__all__ = ["InteractionConfigError", "build_interactions", "load_interactions"]


class InteractionConfigError(ValueError):
    """An interactions file that cannot be turned into interactions; names file, entry, field and fix."""


_SPEC: RegistrySpec[Interaction] = RegistrySpec(
    section="interactions",
    kind="interaction",
    base=Interaction,
    base_path="quartet.agents.interaction.Interaction",
    error=InteractionConfigError,
    entry_keys=("class", "name", "config"),
    entry_options=("name",),
    name_field="name",
    name_fix="give each entry a unique 'name:'",
    verl_section="interaction",
    verl_entry=verl_interaction_entry,
)


def _build_one(entry: Mapping[str, Any], cls: type[Interaction], where: str) -> Interaction:
    if "name" in entry:
        name, source = entry["name"], ""
    else:
        name, source = getattr(cls, "default_name", None), f" ({cls.__name__}.default_name)"
    try:
        check_name(name)
    except InteractionError as exc:
        fix = "give the entry a 'name:'" if source else "fix the name"
        raise InteractionConfigError(f"{where}.name: {exc}{source}; {fix}") from None
    config = entry_config(entry, cls, _SPEC, where)
    return construct(cls, {**config, "name": name}, _SPEC, where)


def build_interactions(entries: object, source: str = "<interactions>") -> dict[str, Interaction]:
    """Interactions by name from a parsed document (`{"interactions": [...]}`) or its list of entries.

    `source` names the document in errors (`load_interactions` passes the file path).
    """
    return build_registry(entries, _SPEC, source, _build_one)


def load_interactions(path: str | os.PathLike[str]) -> dict[str, Interaction]:
    """Interactions by name from a YAML file (module docstring); `InteractionConfigError` on any mistake."""
    return build_interactions(read_yaml(path, _SPEC), str(Path(path)))
