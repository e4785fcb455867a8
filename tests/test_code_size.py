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


def _is_swap(targets: list[ast.expr], values: list[ast.expr]) -> bool:
    """`a, b = b, a`: the same places on both sides, reordered; one line is the clearest way to write it."""
    return sorted(map(ast.unparse, targets)) == sorted(map(ast.unparse, values))


def chained_attribute_assignments(source: str) -> list[tuple[int, str]]:
    """(line, text) of every assignment that packs separate assignments into one tuple to save lines:
    2+ attributes (`self.a, self.b = x, y`) or 3+ names (`a, b, c = 1, 2, 3`) set from a tuple or list
    literal of the same length. Unpacking a call's result (`a, b = f()`) and swaps (`a, b = b, a`) pass."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if not isinstance(target, ast.Tuple | ast.List) or not isinstance(
                node.value, ast.Tuple | ast.List
            ):
                continue
            if len(target.elts) != len(node.value.elts):
                continue
            attributes = sum(isinstance(t, ast.Attribute) for t in target.elts)
            names = sum(isinstance(t, ast.Name) for t in target.elts)
            if (attributes >= 2 or names >= 3) and not _is_swap(target.elts, node.value.elts):
                found.append((node.lineno, lines[node.lineno - 1].strip()))
    return found


def test_the_finder_sees_chained_assignments_and_passes_unpacking_and_swaps() -> None:
    source = (
        "self.a, self.b = 1, 2\na, b, c = 1, 2, 3\na, b = f()\na, b = b, a\nself.a, self.b = self.b, self.a\n"
    )
    assert chained_attribute_assignments(source) == [(1, "self.a, self.b = 1, 2"), (2, "a, b, c = 1, 2, 3")]
    assert chained_attribute_assignments("x, y = 1, 2\nfor i, j in pairs:\n    pass\n") == []


def test_no_line_chains_assignments_to_save_lines() -> None:
    found = [
        f"{path.relative_to(SRC.parent)}:{line} {text}"
        for path in sorted(SRC.rglob("*.py"))
        for line, text in chained_attribute_assignments(path.read_text())
    ]
    assert not found, "lines that pack separate assignments into one (write one a line):\n" + "\n".join(found)
