"""The package layers hold: no module imports from its own or a higher layer (list: tools/layers.py)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quartet_layers", ROOT / "tools" / "layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


layers = _layers()


def test_every_package_is_on_exactly_one_layer() -> None:
    listed = [p for layer in layers.LAYERS for p in layer]
    assert len(listed) == len(set(listed)), "a package appears on two layers"
    assert sorted(listed) == layers.packages()
    assert set(layers.ROLES) == set(listed)


def test_no_module_imports_from_its_own_or_a_higher_layer() -> None:
    found = layers.violations()
    assert not found, "imports against the layers:\n" + "\n".join(map(str, found))


def test_the_check_sees_an_upward_import_even_inside_a_function(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of core/ and trainer/ where a core function imports the trainer lazily must be refused."""
    package = tmp_path / "src" / "quartet"
    for name in ("core", "trainer"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "core" / "sneaky.py").write_text("def f():\n    from ..trainer import step\n    return step\n")
    (package / "trainer" / "step.py").write_text("from quartet.core import sneaky\n")
    monkeypatch.setattr(layers, "PACKAGE", package)
    monkeypatch.setattr(layers, "ROOT", tmp_path)
    found = layers.violations()
    assert [(v.importer, v.target, v.line) for v in found] == [("core", "trainer", 2)]
    assert "core (layer 0) imports quartet.trainer (layer 9)" in str(found[0])


def test_relative_imports_resolve_to_their_package() -> None:
    tree = ast.parse("from ..core import batch\nfrom . import step\nfrom .x import y\n")
    found = layers._imported_modules(tree, ("quartet", "trainer", "step"))
    assert [m for _, m in found] == ["quartet.core", "quartet.trainer", "quartet.trainer.x"]


def test_the_architecture_doc_shows_the_measured_layers() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert layers.diagram() in doc, "docs/architecture.md is stale: paste `python tools/layers.py --diagram`"


def test_contributing_names_every_package_with_its_layer() -> None:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    for index, layer in enumerate(layers.LAYERS):
        for package in layer:
            line = next((row for row in text.splitlines() if row.strip().startswith(f"{package}/ ")), None)
            assert line is not None, f"CONTRIBUTING.md's layout has no line for {package}/"
            assert line.split()[1] == str(index), (
                f"CONTRIBUTING.md puts {package}/ on layer {line.split()[1]}"
            )
