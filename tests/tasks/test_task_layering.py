"""Where the built-in tasks sit: `quartet.tasks` imports neither `quartet.data` nor `quartet.rewards`, and
`quartet.rewards` reaches the tasks' verifiers through `quartet.tasks`, never through `quartet.data`.

Imports inside functions count too (the rule scorer's are lazy), so the check reads the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import quartet

SRC = Path(quartet.__file__).parent


def imported_modules(package: str) -> dict[str, set[str]]:
    """Every absolute module a package's files import, anywhere in them, by file."""
    out: dict[str, set[str]] = {}
    for file in sorted((SRC / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        out[str(file.relative_to(SRC))] = names
    return out


def _offending(package: str, forbidden: str) -> list[str]:
    return sorted(
        f"{file}: {name}"
        for file, names in imported_modules(package).items()
        for name in names
        if name == forbidden or name.startswith(forbidden + ".")
    )


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [("tasks", "quartet.data"), ("tasks", "quartet.rewards"), ("rewards", "quartet.data")],
)
def test_package_does_not_import(package: str, forbidden: str) -> None:
    assert _offending(package, forbidden) == []


def test_rewards_find_the_tasks_in_quartet_tasks() -> None:
    rewards = set().union(*imported_modules("rewards").values())
    assert {"quartet.tasks", "quartet.tasks.calculator"} <= rewards
