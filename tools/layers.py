"""quartet's package layers: the one list, the import check against it, and the diagram in the docs.

    python tools/layers.py            # check: exit 1 and name every import that goes up or sideways
    python tools/layers.py --diagram  # the layer diagram of docs/architecture.md, from the measured imports

A package may import packages of LOWER layers only (not its own layer's neighbours, not a higher layer).
Imports are read from the source with `ast`, including those inside functions (a lazy import is still a
dependency). `tests/test_layers.py` runs the check, checks that every package under `src/quartet` is
listed, and that the diagram in `docs/architecture.md` is the one this script prints.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "quartet"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("config",),
    ("models", "tracking", "weight_sync"),
    ("cluster", "engines", "rollout"),
    ("agents", "planning"),
    ("tasks", "serving", "environments"),
    ("data", "rewards"),
    ("roles",),
    ("sft",),
    ("trainer", "inspector"),
    ("demo",),
    ("cli",),
)
"""Bottom (0) to top. The one place the layers are written down."""

ROLES: dict[str, str] = {
    "core": "the Batch and the RL math: pure functions on tensors",
    "config": "one frozen dataclass per component, YAML + overrides, validate(), the step plan",
    "models": "loading local Hugging Face folders; the tiny-model kit",
    "tracking": "metric sinks, the run folder's layout, plots",
    "weight_sync": "a standalone process group and byte buckets for streaming weights",
    "cluster": "Ray: pools, colocated hosts, dispatch, discovery, failures",
    "engines": "the training engine: FSDP2, offload, micro-batches, packing",
    "rollout": "generation engines behind one token-in/token-out interface",
    "agents": "multi-turn loops, tools, interactions, response masks",
    "planning": "memory of a step per phase and role, before any worker starts",
    "tasks": "built-in tasks: dataset builders, verifiers, their tools",
    "environments": "the environment seam (reset/step), its registry and loop; reasoning-gym, verifiers",
    "serving": "the OpenAI-compatible server, the request scheduler, the Tinker service",
    "data": "datasets in verl's layout, the sampler, bad rows, conversions",
    "rewards": "rule scorers, custom functions and callables, the scoring process pool, the LLM judge",
    "roles": "actor, critic, reference, reward model, rollout: one engine each",
    "sft": "supervised fine-tuning on conversations",
    "trainer": "the driver, in rooms: workers, recovery, records, feed, loop (one way, low to high)",
    "inspector": "`quartet inspect`: a run's curves and rollouts in a local page",
    "demo": "`quartet demo`: SFT start, GRPO, the time-matched control",
    "cli": "`quartet ...` entry points, one module per subcommand",
}
"""What each package owns, one line: printed in the diagram."""


@dataclass(frozen=True)
class Violation:
    """An import from `source` (a module file) into package `target` that is not below the importer."""

    source: str
    line: int
    importer: str
    target: str

    def __str__(self) -> str:
        return (
            f"{self.source}:{self.line}: {self.importer} (layer {layer_of(self.importer)}) imports "
            f"quartet.{self.target} (layer {layer_of(self.target)}); a package imports lower layers only"
        )


def layer_of(package: str) -> int:
    """The layer index of `package`; KeyError names a package missing from `LAYERS`."""
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise KeyError(f"package quartet.{package} is not in LAYERS (tools/layers.py): add it to a layer")


def packages() -> list[str]:
    """Every package directly under src/quartet."""
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py"))


def _imported_modules(tree: ast.Module, module_parts: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in `tree`, relative ones resolved against `module_parts`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(module_parts[: len(module_parts) - node.level])
                found.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            elif node.module:
                found.append((node.lineno, node.module))
    return found


def package_imports() -> dict[str, dict[str, tuple[str, int]]]:
    """importer package -> imported package -> (first file, line) where it happens."""
    edges: dict[str, dict[str, tuple[str, int]]] = defaultdict(dict)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if len(rel.parts) < 3:  # quartet/__init__.py
            continue
        importer = rel.parts[1]
        module_parts = tuple(rel.with_suffix("").parts)
        for line, dotted in _imported_modules(ast.parse(path.read_text()), module_parts):
            parts = dotted.split(".")
            if parts[0] == "quartet" and len(parts) > 1 and parts[1] != importer:
                edges[importer].setdefault(parts[1], (str(path.relative_to(ROOT)), line))
    return edges


def violations() -> list[Violation]:
    """Every package import that does not go to a lower layer."""
    out = []
    for importer, targets in sorted(package_imports().items()):
        for target, (source, line) in sorted(targets.items()):
            if layer_of(target) >= layer_of(importer):
                out.append(Violation(source, line, importer, target))
    return out


def diagram() -> str:
    """The layers top to bottom, each package with what it owns and what it imports (measured)."""
    edges = package_imports()
    width = max(len(p) for layer in LAYERS for p in layer) + 1
    lines = []
    for index in reversed(range(len(LAYERS))):
        for package in LAYERS[index]:
            below = ", ".join(sorted(edges.get(package, {}), key=lambda p: (-layer_of(p), p))) or "-"
            lines.append(f"{index:>2}  {package + '/':<{width}} {ROLES[package]}")
            lines.append(f"    {'':<{width}}   imports: {below}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if "--diagram" in argv:
        print(diagram())
        return 0
    found = violations()
    for violation in found:
        print(violation)
    listed = {p for layer in LAYERS for p in layer}
    unlisted, gone = sorted(set(packages()) - listed), sorted(listed - set(packages()))
    for package in unlisted:
        print(f"package quartet.{package} is not in LAYERS (tools/layers.py): add it to a layer")
    for package in gone:
        print(f"LAYERS (tools/layers.py) lists quartet.{package}, which does not exist: remove it")
    return 1 if found or unlisted or gone else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
