"""No circle of imports between the modules of any package (the check: tools/import_cycles.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "quartet_import_cycles", ROOT / "tools" / "import_cycles.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


import_cycles = _load()


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "src" / "quartet"
    for rel, text in files.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return package


def test_no_package_holds_a_circle_of_imports() -> None:
    found = import_cycles.cycles()
    report = "\n".join("circle: " + "; ".join(str(edge) for edge in circle) for circle in found)
    assert not found, "modules that import each other (cut one edge of each circle):\n" + report


def test_the_check_sees_a_circle_closed_by_a_lazy_and_a_type_only_import(tmp_path: Path) -> None:
    """a -> b at the top, b -> c inside a function, c -> a under TYPE_CHECKING: one circle of three."""
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "eng/__init__.py": "",
            "eng/a.py": "from . import b\n",
            "eng/b.py": "def f():\n    from quartet.eng.c import g\n    return g\n",
            "eng/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import X\n",
            "eng/d.py": "from .a import b\n",
        },
    )
    found = import_cycles.cycles(package)
    assert len(found) == 1
    assert sorted((e.importer, e.target, e.line) for e in found[0]) == [
        ("quartet.eng.a", "quartet.eng.b", 1),
        ("quartet.eng.b", "quartet.eng.c", 2),
        ("quartet.eng.c", "quartet.eng.a", 3),
    ]


def test_importing_the_own_package_init_that_imports_back_is_a_circle(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "eng/__init__.py": "from .engine import Engine\n",
            "eng/engine.py": "from . import helpers\nclass Engine: ...\n",
            "eng/helpers.py": "from quartet.eng import Engine\n",
        },
    )
    found = import_cycles.cycles(package)
    assert [sorted({e.importer for e in c}) for c in found] == [
        ["quartet.eng", "quartet.eng.engine", "quartet.eng.helpers"]
    ]


def test_a_one_way_package_has_no_circle(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "eng/__init__.py": "from .engine import Engine\n",
            "eng/engine.py": "from .helpers import h\nclass Engine: ...\n",
            "eng/helpers.py": "import os\ndef h():\n    from quartet.eng import leaf\n    return leaf\n",
            "eng/leaf.py": "X = 1\n",
        },
    )
    assert import_cycles.cycles(package) == []
