"""Interactions from YAML: a good file, and every mistake reported with file, entry index, field and fix."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from quartet.agents.interaction_registry import (
    InteractionConfigError,
    build_interactions,
    load_interactions,
)
from quartet.agents.interactions.guessing import GuessingGameInteraction

GAME = "quartet.agents.interactions.guessing:GuessingGameInteraction"

# Interaction classes for the error paths, in a real module written to a temp dir and put on sys.path.
_HELPERS = """
from typing import Any
from quartet.agents.interaction import Interaction, InteractionReply


class Nameless(Interaction):
    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        return InteractionReply("", done=True)


class Open(Interaction):
    default_name = "open"

    def __init__(self, *, name: str | None = None, **options: Any) -> None:
        super().__init__(name=name)
        self.options = options

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        return InteractionReply("", done=True)


class Abstract(Interaction):
    default_name = "abstract"
"""


@pytest.fixture
def helpers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The module name of the helper interactions (plus a module that fails on import, 'broken_helpers')."""
    folder = tmp_path / "helper_modules"
    folder.mkdir()
    (folder / "interaction_helpers_mod.py").write_text(_HELPERS)
    (folder / "broken_helpers_mod.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(folder))
    return "interaction_helpers_mod"


def _write(tmp_path: Path, entries: list[Any]) -> Path:
    path = tmp_path / "interactions.yaml"
    path.write_text(yaml.safe_dump({"interactions": entries}))
    return path


def _error(tmp_path: Path, entries: list[Any], where: str) -> str:
    """The error message of loading `entries`, checked to start with the file and `where`."""
    path = _write(tmp_path, entries)
    with pytest.raises(InteractionConfigError) as info:
        load_interactions(path)
    message = str(info.value)
    assert message.startswith(f"{path}: {where}"), message
    return message


def test_good_file(tmp_path: Path, helpers: str) -> None:
    path = tmp_path / "interactions.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            interactions:
              - class: {GAME}
              - class: quartet.agents.interactions.guessing.GuessingGameInteraction   # module.Class
                name: hard_game
                config: {{max_guesses: 3}}
              - class: {helpers}:Open
                config: {{anything: 1}}
            """
        )
    )
    built = load_interactions(path)
    assert list(built) == ["guessing_game", "hard_game", "open"]
    easy, hard, other = built["guessing_game"], built["hard_game"], built["open"]
    assert isinstance(easy, GuessingGameInteraction) and easy.max_guesses == 7
    assert isinstance(hard, GuessingGameInteraction) and hard.max_guesses == 3 and hard.name == "hard_game"
    assert other.options == {"anything": 1}  # type: ignore[attr-defined]


def test_build_from_entries_or_document() -> None:
    entries = [{"class": GAME, "config": {"max_guesses": 2}}]
    assert list(build_interactions(entries)) == ["guessing_game"]
    assert list(build_interactions({"interactions": entries})) == ["guessing_game"]
    assert build_interactions({"interactions": []}) == {}
    with pytest.raises(InteractionConfigError, match=r"^rows\.yaml: interactions\[0\]\.config: "):
        build_interactions([{"class": GAME, "config": {"max_guesses": 0}}], source="rows.yaml")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InteractionConfigError) as info:
        load_interactions(path)
    assert str(info.value).startswith(f"{path}: cannot read the interactions file")
    assert "check the path" in str(info.value)


def test_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "interactions.yaml"
    path.write_text("interactions: [\n  - class: x\n")
    with pytest.raises(InteractionConfigError, match="not valid YAML"):
        load_interactions(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "expected a top-level 'interactions:' list"),
        ("interactions: {class: x}", "expected a top-level 'interactions:' list"),
        ("interactons: []", "interactons: unknown top-level key; did you mean 'interactions'?"),
        ("interactions: []\ninteraction: []", "both interactions and interaction; keep one list"),
    ],
)
def test_bad_document(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "interactions.yaml"
    path.write_text(text)
    with pytest.raises(InteractionConfigError) as info:
        load_interactions(path)
    assert str(info.value).startswith(f"{path}: ") and expected in str(info.value)


def test_entry_not_a_mapping(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": GAME}, GAME], "interactions[1]: ")
    assert "expected a mapping with 'class'" in message


def test_unknown_entry_key(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": GAME, "confg": {}}], "interactions[0].confg: ")
    assert "unknown key; did you mean 'config'?" in message and "known: class, name, config" in message


def test_missing_class(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"name": "x"}], "interactions[0].class: ")
    assert "write the interaction class as 'package.module:ClassName'" in message


def test_class_path_without_module(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": "GuessingGameInteraction"}], "interactions[0].class: ")
    assert "is not 'package.module:ClassName'" in message


def test_unknown_module(tmp_path: Path) -> None:
    entries = [{"class": "quartet.agents.interactions.guess:GuessingGameInteraction"}]
    message = _error(tmp_path, entries, "interactions[0].class: ")
    assert "cannot import module 'quartet.agents.interactions.guess'" in message
    assert "check the module path" in message


def test_module_failing_on_import(tmp_path: Path, helpers: str) -> None:
    message = _error(tmp_path, [{"class": "broken_helpers_mod:Thing"}], "interactions[0].class: ")
    assert "RuntimeError: boom at import" in message


def test_unknown_class(tmp_path: Path) -> None:
    entries = [{"class": GAME}, {"class": "quartet.agents.interactions.guessing:GuessingGameInteractoin"}]
    message = _error(tmp_path, entries, "interactions[1].class: ")
    assert "has no 'GuessingGameInteractoin'; did you mean 'GuessingGameInteraction'?" in message
    assert "(interaction classes there: GuessingGameInteraction)" in message


def test_not_an_interaction(tmp_path: Path) -> None:
    entries = [{"class": "quartet.agents.tools.calculator:CalculatorTool"}]
    message = _error(tmp_path, entries, "interactions[0].class: ")
    assert "not a concrete subclass of quartet.agents.interaction.Interaction" in message


@pytest.mark.parametrize("target", ["quartet.agents.interaction:Interaction", "{helpers}:Abstract"])
def test_abstract_class(tmp_path: Path, helpers: str, target: str) -> None:
    entries = [{"class": target.format(helpers=helpers)}]
    message = _error(tmp_path, entries, "interactions[0].class: ")
    assert "not a concrete subclass" in message


def test_unknown_option(tmp_path: Path) -> None:
    entries = [{"class": GAME, "config": {"max_guess": 3}}]
    message = _error(tmp_path, entries, "interactions[0].config: ")
    assert "GuessingGameInteraction has no option 'max_guess'; did you mean 'max_guesses'?" in message
    assert "(options: max_guesses, consistent_guess_reward, announce_range)" in message


def test_name_in_config(tmp_path: Path, helpers: str) -> None:
    for cls in (GAME, f"{helpers}:Open"):  # refused even where the constructor takes **options
        message = _error(tmp_path, [{"class": cls, "config": {"name": "x"}}], "interactions[0].config: ")
        assert "set it as the entry's own 'name:' key" in message


def test_config_not_a_mapping(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": GAME, "config": [3]}], "interactions[0].config: ")
    assert "expected a mapping of constructor options" in message


def test_constructor_refuses_value(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": GAME, "config": {"max_guesses": 0}}], "interactions[0].config: ")
    assert "GuessingGameInteraction(...) failed: InteractionError" in message
    assert "max_guesses must be a positive integer, got 0" in message


@pytest.mark.parametrize("name", ["has space", "", 7, None])
def test_bad_name(tmp_path: Path, name: object) -> None:
    message = _error(tmp_path, [{"class": GAME, "name": name}], "interactions[0].name: ")
    assert "1-64 letters, digits" in message and "fix the name" in message


def test_no_default_name(tmp_path: Path, helpers: str) -> None:
    message = _error(tmp_path, [{"class": f"{helpers}:Nameless"}], "interactions[0].name: ")
    assert "(Nameless.default_name)" in message and "give the entry a 'name:'" in message
    assert list(load_interactions(_write(tmp_path, [{"class": f"{helpers}:Nameless", "name": "n"}]))) == ["n"]


def test_duplicate_names(tmp_path: Path) -> None:
    entries = [
        {"class": GAME, "name": "other"},
        {"class": GAME},
        {"class": GAME, "config": {"max_guesses": 2}},
    ]
    message = _error(tmp_path, entries, "interactions[2].name: ")
    assert "duplicate interaction name 'guessing_game' (also interactions[1])" in message
    assert "give each entry a unique 'name:'" in message
