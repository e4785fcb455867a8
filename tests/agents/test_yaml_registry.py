"""The YAML loader shared by the tools and interactions files: each mistake is reported the same way by both
registries, as `<file>: <section>[<index>].<field>: <problem>; <fix>`, in each registry's own error type."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from quartet.agents.interaction_registry import InteractionConfigError, load_interactions
from quartet.agents.tools.registry import ToolConfigError, load_tools


@dataclass(frozen=True)
class Registry:
    section: str
    kind: str
    load: Callable[[Path], dict[str, Any]]
    error: type[ValueError]
    good_class: str
    entry_option: str  # a constructor argument set by an entry key, refused inside `config`


TOOLS = Registry(
    "tools", "tool", load_tools, ToolConfigError, "quartet.agents.tools.calculator:CalculatorTool", "schema"
)
INTERACTIONS = Registry(
    "interactions",
    "interaction",
    load_interactions,
    InteractionConfigError,
    "quartet.agents.interactions.guessing:GuessingGameInteraction",
    "name",
)


@pytest.fixture(params=[TOOLS, INTERACTIONS], ids=lambda r: r.section)
def registry(request: pytest.FixtureRequest) -> Registry:
    return request.param  # type: ignore[no-any-return]


def error_of(registry: Registry, path: Path) -> str:
    """The message of loading `path`, which must fail with the registry's own error type."""
    with pytest.raises(registry.error) as info:
        registry.load(path)
    return str(info.value)


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "registry.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    return path


def test_a_good_file_loads(tmp_path: Path, registry: Registry) -> None:
    built = registry.load(write(tmp_path, {registry.section: [{"class": registry.good_class}]}))
    assert len(built) == 1
    ((name, item),) = built.items()
    assert item.name == name and type(item).__name__ == registry.good_class.rpartition(":")[2]


def test_a_missing_file(tmp_path: Path, registry: Registry) -> None:
    path = tmp_path / "absent.yaml"
    message = error_of(registry, path)
    assert (
        message
        == f"{path}: cannot read the {registry.section} file (No such file or directory); check the path"
    )


def test_a_file_that_is_not_yaml(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, f"{registry.section}: [\n  - class: x\n")
    message = error_of(registry, path)
    assert message.startswith(f"{path}: not valid YAML: ")


def test_an_unknown_top_level_key(tmp_path: Path, registry: Registry) -> None:
    typo = registry.section[:-2] + registry.section[-1]  # 'tols:' for 'tools:'
    path = write(tmp_path, {typo: []})
    message = error_of(registry, path)
    known = "interactions, interaction" if registry.section == "interactions" else "tools"  # verl's singular
    assert message == (
        f"{path}: {typo}: unknown top-level key; did you mean {registry.section!r}?; known: {known}"
    )


@pytest.mark.parametrize("document", ["", "{}", "7", "SECTION: {class: x}"])
def test_a_document_without_its_list(tmp_path: Path, registry: Registry, document: str) -> None:
    path = write(tmp_path, document.replace("SECTION", registry.section))
    message = error_of(registry, path)
    assert message == (
        f"{path}: {registry.section}: expected a top-level '{registry.section}:' list of entries"
        " (each '- class: ...')"
    )


def test_an_unknown_entry_key(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, {registry.section: [{"class": registry.good_class, "clas": "x"}]})
    message = error_of(registry, path)
    assert message.startswith(f"{path}: {registry.section}[0].clas: unknown key; did you mean 'class'?; ")
    assert "known: class, " in message


def test_a_missing_class_field(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, {registry.section: [{"class": registry.good_class}, {"config": {}}]})
    message = error_of(registry, path)
    assert message == (
        f"{path}: {registry.section}[1].class: missing; write the {registry.kind} class as "
        "'package.module:ClassName'"
    )


def test_an_entry_that_is_not_a_mapping(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, {registry.section: [registry.good_class]})
    message = error_of(registry, path)
    assert message.startswith(f"{path}: {registry.section}[0]: expected a mapping with 'class' (and ")


def test_a_class_of_the_wrong_kind(tmp_path: Path, registry: Registry) -> None:
    other = INTERACTIONS if registry is TOOLS else TOOLS
    path = write(tmp_path, {registry.section: [{"class": other.good_class}]})
    message = error_of(registry, path)
    assert message.startswith(f"{path}: {registry.section}[0].class: {other.good_class!r} is not a concrete")
    assert message.endswith("; point to one")


def test_an_unknown_class_lists_the_module_s_classes_but_not_the_base(
    tmp_path: Path, registry: Registry
) -> None:
    module, _, name = registry.good_class.partition(":")
    path = write(tmp_path, {registry.section: [{"class": f"{module}:{name[:-1]}"}]})
    message = error_of(registry, path)
    assert f"has no {name[:-1]!r}; did you mean {name!r}? ({registry.kind} classes there: {name})" in message


def test_an_entry_option_inside_config(tmp_path: Path, registry: Registry) -> None:
    entry = {"class": registry.good_class, "config": {registry.entry_option: "x"}}
    message = error_of(registry, write(tmp_path, {registry.section: [entry]}))
    assert f"{registry.section}[0].config: '{registry.entry_option}' is not a config option; " in message
    assert f"set it as the entry's own '{registry.entry_option}:' key" in message


def test_an_unknown_option(tmp_path: Path, registry: Registry) -> None:
    entry = {"class": registry.good_class, "config": {"no_such_option": 1}}
    message = error_of(registry, write(tmp_path, {registry.section: [entry]}))
    assert f"{registry.section}[0].config: " in message and "has no option 'no_such_option'" in message


def test_a_duplicate_name_names_both_entries(tmp_path: Path, registry: Registry) -> None:
    entries = [{"class": registry.good_class}, {"class": registry.good_class}]
    message = error_of(registry, write(tmp_path, {registry.section: entries}))
    assert f"{registry.section}[1]." in message
    assert f"duplicate {registry.kind} name " in message and f"(also {registry.section}[0])" in message
