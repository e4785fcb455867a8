"""The loop's seams hold: decisions come from the plan, recovery hides behind the rollout view.

Issue 47's rules, checked over the source with `ast` so that a later change cannot slip a branch back in:
no module outside `quartet.config` names `TrainerMode` (what the mode implies is a field of `StepPlan`);
the step, the batch sources and the weight sync never import the recovery room nor name a keeper.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "quartet"
TRAINER = SRC / "trainer"
KEEPER_FREE = [TRAINER / "loop" / "step.py", *sorted((TRAINER / "feed").glob("*.py"))]
KEEPER_FREE += sorted((TRAINER / "workers").glob("*.py"))


def _names(path: Path) -> list[tuple[int, str]]:
    """(line, identifier) of every name, attribute and imported name in the module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name):
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom):
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def trainer_mode_uses(root: Path) -> list[str]:
    """`file:line` of every use of `TrainerMode` outside `root/config`."""
    return [
        f"{path.relative_to(root.parent)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if (root / "config") not in path.parents
        for line, name in _names(path)
        if name == "TrainerMode"
    ]


def recovery_mentions(paths: list[Path], root: Path = SRC) -> list[str]:
    """`file:line name` where one of `paths` (under `root`) imports the recovery room or names a keeper."""
    return [
        f"{path.relative_to(root.parent)}:{line} {name}"
        for path in paths
        for line, name in _names(path)
        if "trainer.recovery" in name or "keeper" in name.lower()
    ]


def test_no_module_outside_config_branches_on_the_trainer_mode() -> None:
    found = trainer_mode_uses(SRC)
    assert not found, "TrainerMode used outside quartet.config (read a StepPlan field):\n" + "\n".join(found)


def test_the_step_sources_and_weight_sync_know_no_recovery() -> None:
    assert len(KEEPER_FREE) >= 5  # the step, the sources, the view and the weight sync are all looked at
    found = recovery_mentions(KEEPER_FREE)
    assert not found, "recovery reached the step path (use the RolloutCalls view):\n" + "\n".join(found)


def test_the_checks_see_a_mode_branch_and_a_keeper(tmp_path: Path) -> None:
    package = tmp_path / "quartet"
    (package / "config").mkdir(parents=True)
    (package / "trainer").mkdir()
    (package / "config" / "plan.py").write_text("from .trainer import TrainerMode\n")
    step = package / "trainer" / "step.py"
    step.write_text(
        "from quartet.config import TrainerMode\n"
        "from quartet.trainer.recovery.healing import heal\n"
        "def run(self):\n"
        "    if self.cfg.trainer.mode is TrainerMode.ASYNC:\n"
        "        self.weights.keeper.sync()\n"
    )
    assert trainer_mode_uses(package) == ["quartet/trainer/step.py:1", "quartet/trainer/step.py:4"]
    found = recovery_mentions([step], package)
    assert [f.split()[0] for f in found] == ["quartet/trainer/step.py:2", "quartet/trainer/step.py:5"]
