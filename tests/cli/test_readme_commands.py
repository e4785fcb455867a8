"""Every shell command of the README and of docs/index.md, run as a user types it.

The commands are read from the pages' ```bash blocks, in order, and run one after another in one scratch
folder that holds what a clone holds at its root (`examples/`, `docs/`, the Makefile, `.venv`), from a
shell whose PATH does not hold the venv until the page's own `. .venv/bin/activate` line puts it there. A
command that trains runs a shrunk version (a step or two: the overrides in `SHRINK`, appended as a user
would); the two `make` targets are checked with `make -n` (the suite cannot run itself, and the demo runs
end to end in `tests/cli/test_cli.py`). A command these pages gain without an entry here fails the test,
so a page cannot show a command that nobody ran.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", ROOT / "docs" / "index.md")
CLONE_ROOT = ("examples", "docs", "Makefile", "pyproject.toml", "constraints.txt", "src", ".venv")
"""What the scratch folder links from the repository: enough for the pages' relative paths to resolve."""
ACTIVATE = ". .venv/bin/activate"
TINY = ["model.tiny.hidden_size=64", "model.tiny.num_hidden_layers=2", "model.tiny.intermediate_size=128"]


@dataclass(frozen=True)
class Check:
    """How one command is run and what it must leave: `extra` appended to it, `dry` to run `make -n`
    instead of `make`, `prints` in its output, `leaves` (paths) in the scratch folder."""

    extra: tuple[str, ...] = ()
    dry: bool = False
    prints: tuple[str, ...] = ()
    leaves: tuple[str, ...] = ()


CHECKS: dict[str, Check] = {
    "make demo": Check(dry=True, prints=(".venv/bin/quartet demo",)),
    "make test": Check(dry=True, prints=("pytest",)),
    "quartet demo --quick": Check(
        extra=("sft.epochs=2", "trainer.total_steps=2", "data.builtin_train_size=256", *TINY),
        prints=("expected: ", "SFT start", "more SFT (control)", "says nothing about which row is better"),
        leaves=("runs/demo-quick-seed0/grpo/metrics.jsonl",),
    ),
    "quartet train examples/grpo_arithmetic/config.yaml": Check(
        extra=(
            "sft.epochs=1",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "data.builtin_val_size=16",
            "data.val_batch_size=16",
            *TINY,
        ),
        prints=("sft warm start trained", "done: 2 steps"),
        leaves=("runs/quartet/grpo-arithmetic/metrics.jsonl", "runs/quartet/grpo-arithmetic-sft_start/hf"),
    ),
    "quartet plot runs/quartet/grpo-arithmetic": Check(leaves=("runs/quartet/grpo-arithmetic/plots.png",)),
    "quartet plan examples/single_cpu/config.yaml": Check(prints=("fits",)),
    "quartet config show --doc": Check(prints=("rollout.n = ",)),
    "quartet --help": Check(prints=("train", "demo", "inspect")),
}
"""Each command of the pages, exactly as written there (its trailing comment dropped)."""


def page_commands(page: Path) -> list[str]:
    """The commands of a page's ```bash blocks, in order, without their comments."""
    blocks = re.findall(r"^```bash\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _user_env() -> dict[str, str]:
    """This process's environment as a fresh shell has it: no venv active, none of its bin on PATH."""
    venv_bin = str(ROOT / ".venv" / "bin")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env


def _scratch_clone(tmp_path: Path) -> Path:
    for name in CLONE_ROOT:
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def test_every_command_of_the_pages_has_a_check() -> None:
    commands = [c for page in PAGES for c in page_commands(page)]
    assert ACTIVATE in page_commands(PAGES[0]), "the README says once how to put quartet on PATH"
    unchecked = sorted(set(commands) - set(CHECKS) - {ACTIVATE})
    assert not unchecked, f"commands on the pages with no entry in CHECKS (add how to run them): {unchecked}"
    stale = sorted(set(CHECKS) - set(commands))
    assert not stale, f"CHECKS entries no page shows any more (remove them): {stale}"


def test_the_activate_line_puts_the_venv_quartet_on_path(tmp_path: Path) -> None:
    clone = _scratch_clone(tmp_path)
    found = subprocess.run(
        ["bash", "-c", f"{ACTIVATE} && command -v quartet"],
        cwd=clone,
        env=_user_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).resolve() == (clone / ".venv" / "bin" / "quartet").resolve()


def test_the_pages_commands_work_as_written(tmp_path: Path) -> None:
    clone = _scratch_clone(tmp_path)
    env = _user_env()
    for page in PAGES:
        active = False
        for command in page_commands(page):
            if command == ACTIVATE:
                active = True
                continue
            check = CHECKS[command]
            if command.startswith("quartet"):
                assert active or page.name == "index.md", (
                    f"{page.name}: {command!r} comes before {ACTIVATE!r}"
                )
            line = command.replace("make ", "make -n ", 1) if check.dry else command
            line = " ".join([line, *check.extra])
            done = subprocess.run(
                ["bash", "-c", f"{ACTIVATE} && {line}"],
                cwd=clone,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            out = done.stdout + done.stderr
            assert done.returncode == 0, f"{page.name}: {line}\n{out[-4000:]}"
            flat = " ".join(out.split())
            for text in check.prints:
                assert text in flat, f"{page.name}: {line} did not print {text!r}:\n{out[-3000:]}"
            for path in check.leaves:
                assert (clone / path).exists(), f"{page.name}: {line} left no {path}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_pages_local_links_resolve(page: Path) -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", page.read_text())
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    missing = [t for t in local if not (page.parent / t).exists()]
    assert local and not missing, f"{page.name}: links to nothing: {missing}"


def test_the_readme_is_read_in_two_minutes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 100, f"README.md has {len(lines)} lines; the reference belongs in docs/"
    head = "\n".join(lines[:12])
    assert ACTIVATE in head and ".venv/bin/quartet" in head  # how to run the CLI, before any command
