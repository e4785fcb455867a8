"""Circles of imports between quartet's modules: the check beside the layer check.

    python tools/import_cycles.py     # exit 1 and print every circle, each edge with its file and line

The layer check (`tools/layers.py`) keeps packages pointing down; this one keeps the modules INSIDE a
package pointing one way. Every import counts: at the top of a module, inside a function (a lazy import
that dodges a circle at run time is still a circle in the design) and under `if TYPE_CHECKING:`.
`from pkg import name` counts as importing `pkg.name` when that is a module, otherwise `pkg` itself (its
`__init__`); so a module that imports its own package's `__init__` joins a circle when the `__init__`
imports it back. `tests/test_layers.py` runs the check.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "quartet"


@dataclass(frozen=True)
class Edge:
    """`importer` imports `target` at `source:line`."""

    importer: str
    target: str
    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} -> {self.target}  ({self.source}:{self.line})"


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `package` (a package is its `__init__`)."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _targets(dotted: str, names: list[str], known: dict[str, Path]) -> list[str]:
    """The known modules an import of `names` from `dotted` loads (`names` empty for `import dotted`)."""
    if dotted not in known:
        parts = dotted.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        return [".".join(parts)] if parts else []
    submodules = [f"{dotted}.{name}" for name in names if f"{dotted}.{name}" in known]
    if len(submodules) < len(names) or not names:
        submodules.append(dotted)
    return submodules


def module_edges(package: Path = PACKAGE) -> dict[str, list[Edge]]:
    """Importer module -> its imports of other modules of the package, lazy and type-only ones included."""
    known = modules(package)
    root = package.name
    edges: dict[str, list[Edge]] = {}
    for name, path in known.items():
        own_parts = path.relative_to(package.parent).with_suffix("").parts
        out: dict[str, Edge] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                pairs: list[tuple[str, list[str]]] = [(alias.name, []) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = own_parts[: len(own_parts) - node.level] if node.level else ()
                dotted = ".".join([*base, node.module] if node.module else base)
                pairs = [(dotted, [alias.name for alias in node.names])]
            else:
                continue
            for dotted, names in pairs:
                if dotted.split(".")[0] != root:
                    continue
                for target in _targets(dotted, names, known):
                    if target != name and target not in out:
                        source = str(path.relative_to(package.parent.parent))
                        out[target] = Edge(name, target, source, node.lineno)
        edges[name] = list(out.values())
    return edges


def cycles(package: Path = PACKAGE) -> list[list[Edge]]:
    """One circle per strongly connected group of modules, as the edges that close it, sorted."""
    edges = module_edges(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative so deep packages cannot overflow
        work = [(start, 0)]
        while work:
            node, next_edge = work.pop()
            if next_edge == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            targets = [e.target for e in edges.get(node, [])]
            if next_edge < len(targets):
                work.append((node, next_edge + 1))
                target = targets[next_edge]
                if target not in index:
                    work.append((target, 0))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return sorted([_circle(group, edges) for group in groups], key=lambda c: c[0].importer)


def _circle(group: list[str], edges: dict[str, list[Edge]]) -> list[Edge]:
    """The edges inside `group` (a strongly connected set), so the report shows every line to cut."""
    members = set(group)
    return [edge for name in group for edge in edges[name] if edge.target in members]


def main() -> int:
    found = cycles()
    for circle in found:
        print("circle: " + ", ".join(sorted({e.importer for e in circle})))
        for edge in circle:
            print(f"  {edge}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
