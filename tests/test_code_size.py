"""Size budgets: no function over 60 lines, no module over 500 (a long one is a missing concept)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "quartet"
MAX_FUNCTION_LINES = 60
"""From `def` to the function's last line, docstring and comments included."""
MAX_MODULE_LINES = 500


def long_functions(source: str, max_lines: int) -> list[tuple[str, int, int]]:
    """(name, first line, length) of every function or method in `source` longer than `max_lines`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > max_lines:
                found.append((node.name, node.lineno, length))
    return found


def test_the_counter_sees_a_long_nested_function() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    source = f"class A:\n    def short(self):\n        return 1\n    def long(self):\n{body}\n"
    assert long_functions(source, 60) == [("long", 4, 61)]
    assert long_functions(source, 61) == []


def test_no_function_is_longer_than_the_budget() -> None:
    found = [
        f"{path.relative_to(SRC.parent)}:{line} {name} ({length} lines)"
        for path in sorted(SRC.rglob("*.py"))
        for name, line, length in long_functions(path.read_text(), MAX_FUNCTION_LINES)
    ]
    assert not found, f"functions over {MAX_FUNCTION_LINES} lines (split by concept):\n" + "\n".join(found)


def test_no_module_is_longer_than_the_budget() -> None:
    found = [
        f"{path.relative_to(SRC.parent)} ({n} lines)"
        for path in sorted(SRC.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert not found, f"modules over {MAX_MODULE_LINES} lines (split by concept):\n" + "\n".join(found)
