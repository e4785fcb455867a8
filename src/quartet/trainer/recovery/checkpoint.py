"""Run checkpoints that a crash cannot break, and finding the one to resume from.

Layout, under `<run dir>/checkpoints/`:

    global_step_N/
        actor/                  the actor's engine checkpoint (sharded model + optimizer, per-rank scheduler,
                                RNG, counters and role state; `quartet.engines.checkpoint`)
        critic/                 the same for the critic (PPO with GAE)
        trainer_state.json      step, sampler position, KL controller, train seconds, world size and layout,
                                base model
        config.yaml             the run's resolved config
        manifest.json           written last: every other file's size and sha256 (`recovery.manifest`)
    latest                      one line: the name of the newest complete checkpoint ("global_step_N")

Atomicity: a checkpoint is written under `.tmp-global_step_N/`, every file flushed to disk, then the folder
is renamed to `global_step_N` (a rename is atomic), and only then is `latest` replaced (written to a
temporary file, flushed, `os.replace`d). A crash at any point leaves `latest` naming a complete checkpoint
(or absent, before the first); a half-written `.tmp-*` folder is ignored and removed by the next save.
`max_checkpoints_to_keep` prunes the oldest complete ones after `latest` moves.

Re-saving a step that already has a checkpoint (a run resumed from an older one reaches it again) never
deletes the old folder before the new one is in: when `latest` names this step, a marker
`.resave-global_step_N` is written and `latest` pointed at the newest other complete checkpoint (so it never
names a missing folder); the old folder is renamed aside to `.old-global_step_N`, the new one renamed in,
`latest` pointed at it, and only then are the old one and the marker deleted. Resuming (and the next save)
repairs what a crash between those steps left: an `.old-*` folder whose step folder is missing is renamed
back, one whose step folder is back is deleted; a marker whose step is complete (old or new) points
`latest` back at it, so the run resumes from that step, not the older one `latest` was parked on (which
redid the steps between); and a `latest` naming a missing or incomplete folder falls back, with a warning,
to the newest complete checkpoint.

Integrity (`quartet.trainer.recovery.manifest`): each checkpoint's `manifest.json`, every file's size and
sha256, is written last inside `.tmp-global_step_N/` (temporary file, renamed in), before the folder is
renamed into place and `latest` moves. Resuming checks the chosen checkpoint against it (sizes, then hashes);
a missing, truncated or changed file is named (file, expected, found) and the next older complete checkpoint
is tried, with a warning and the rejected ones in the `resume` record. A checkpoint without a manifest
(written before manifests) is used with a one-line warning.

Elastic resume: a checkpoint may be resumed on another world size or layout (dp, sp, tp, ep). The roles
reshard their model and optimizer on load and follow `quartet.engines.elastic` for per-rank state; the
driver's state (sampler position, KL controller, counters) does not depend on the world. `load_trainer_state`
logs one line naming the old and new world and what is not carried exactly (the per-rank RNG streams of new
ranks, seeded from (seed, step, rank); those of dropped ranks). What the new world cannot run (a global
batch it does not divide) is refused by the config's validation before any checkpoint is read.

The reference policy is frozen (it is the starting model) and the rollout engine gets the actor's weights
by a sync after loading, so neither is saved. With several nodes the run folder must be on storage every
node sees, as in verl.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quartet.tracking.run_layout import (
    CHECKPOINT_GLOB,
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    LATEST_FILE,
    TRAINER_STATE_FILE,
    checkpoint_name,
    checkpoint_step,
)
from quartet.trainer.recovery.manifest import Verdict, verify_checkpoint, write_manifest

__all__ = [
    "CheckpointError",
    "ResumeChoice",
    "TrainerState",
    "choose_resume_checkpoint",
    "find_resume_checkpoint",
    "layout_label",
    "list_checkpoints",
    "load_trainer_state",
    "save_checkpoint",
    "world_change",
]

log = logging.getLogger(__name__)

_RESAVE = ".resave-"  # prefix of the marker a re-save of the step `latest` names leaves until it is done


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: missing, incomplete, or written by an incompatible run."""


@dataclass
class TrainerState:
    """The driver's side of a checkpoint (the roles' state lives in their folders)."""

    step: int
    sampler: dict[str, Any]
    kl_ctrl: dict[str, Any]
    train_seconds: float
    world_size: int
    model_path: str
    """The base model folder the roles were built from (`quartet export` rebuilds the actor from it)."""
    roles: list[str] = field(default_factory=list)
    """Role folders in the checkpoint."""
    weight_version: int = 0
    """Actor updates so far: the version of the weights the rollout replicas got last."""
    layout: dict[str, int] = field(default_factory=dict)
    """The actor's parallel sizes (dp, sp, tp, ep) when it was written; empty in older checkpoints."""


def _fsync_tree(folder: Path) -> None:
    """Flush every file under `folder`, then the folders (so a rename cannot expose empty files)."""
    for path in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        _fsync(path)
    _fsync(folder)


def _fsync(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of the run (holding their state file), oldest step first."""
    root = run_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return []
    found = [
        (step, p)
        for p in root.iterdir()
        if p.is_dir() and (step := checkpoint_step(p.name)) is not None and (p / TRAINER_STATE_FILE).exists()
    ]
    return [p for _, p in sorted(found)]


def _write_atomic(root: Path, name: str, text: str) -> None:
    """`root/name` holds `text`, replaced atomically (a crash leaves the old content or the new)."""
    tmp = root / f".{name}.tmp"
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / name)
    _fsync(root)


def _point_latest(root: Path, name: str) -> None:
    """`latest` names `name`, replaced atomically."""
    _write_atomic(root, LATEST_FILE, name + "\n")


def _latest_name(root: Path) -> str | None:
    pointer = root / LATEST_FILE
    return pointer.read_text().strip() if pointer.exists() else None


def _restore_set_aside(root: Path) -> None:
    """An `.old-*` folder back in place when its re-save did not get the new one in; deleted when it did."""
    for old in root.glob(f".old-{CHECKPOINT_GLOB}"):
        final = root / old.name.removeprefix(".old-")
        if (final / TRAINER_STATE_FILE).exists():
            shutil.rmtree(old, ignore_errors=True)  # the new one is in: the old one was to be deleted
        elif (old / TRAINER_STATE_FILE).exists():
            if final.exists():
                shutil.rmtree(final)
            os.rename(old, final)  # crashed between moving the old one aside and the new one in
            _fsync(root)
            log.warning("restored %s, set aside by a re-save that was interrupted", final)


def _repair(root: Path) -> None:
    """Finish or undo a re-save a crash interrupted (see the module docstring): the step folder as it was
    or as it became, and `latest` naming it again when it named it before."""
    if not root.is_dir():
        return
    _restore_set_aside(root)
    for marker in root.glob(f"{_RESAVE}{CHECKPOINT_GLOB}"):
        name = marker.name.removeprefix(_RESAVE)
        if (root / name / TRAINER_STATE_FILE).exists() and _latest_name(root) != name:
            _point_latest(root, name)
            log.warning("latest names %s again, which an interrupted re-save had moved it off", name)
        _drop_marker(root, name)


def _drop_marker(root: Path, name: str) -> None:
    marker = root / (_RESAVE + name)
    if marker.exists():
        os.remove(marker)
        _fsync(root)


def _set_aside(root: Path, final: Path) -> Path:
    """Move an existing `final` out of the way of its re-save; `latest` never names a missing folder, and a
    marker says it named `final` (`_repair` points it back after a crash)."""
    if _latest_name(root) == final.name:
        others = [p for p in list_checkpoints(root.parent) if p != final]
        if others:
            _write_atomic(root, _RESAVE + final.name, final.name + "\n")
            _point_latest(root, others[-1].name)
    aside = root / f".old-{final.name}"
    os.rename(final, aside)
    _fsync(root)
    return aside


def save_checkpoint(
    run_dir: Path,
    state: TrainerState,
    config_yaml: str,
    save_roles: Callable[[Path], list[str]],
    keep: int,
    after_roles_saved: Callable[[Path], None] | None = None,
) -> Path:
    """Write `global_step_<state.step>` atomically, point `latest` at it, prune to `keep` (0: keep all).

    `save_roles(folder)` writes every role's state under `folder` and returns the role folder names.
    `after_roles_saved(tmp_folder)` is a test hook (e.g. one that kills the process mid-write).
    """
    root = run_dir / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # left by a crash mid-save
        shutil.rmtree(stale, ignore_errors=True)
    _repair(root)
    name = checkpoint_name(state.step)
    tmp, final = root / f".tmp-{name}", root / name
    tmp.mkdir()
    state.roles = save_roles(tmp)
    if after_roles_saved is not None:
        after_roles_saved(tmp)
    (tmp / TRAINER_STATE_FILE).write_text(json.dumps(asdict(state), indent=1))
    (tmp / CONFIG_FILE).write_text(config_yaml)
    _fsync_tree(tmp)  # every file complete on disk before it is hashed
    write_manifest(tmp, state.step)  # last: its presence says every file it lists was whole
    _fsync(tmp)
    # a checkpoint of this step from an earlier attempt: replaced, deleted only once the new one is in
    aside = _set_aside(root, final) if final.exists() else None
    os.rename(tmp, final)
    _fsync(root)
    _point_latest(root, name)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
        _drop_marker(root, name)  # `latest` names this step again, if it did before
    if keep > 0:
        for old in list_checkpoints(run_dir)[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    log.info("checkpoint saved: %s", final)
    return final


@dataclass
class ResumeChoice:
    """The checkpoint to resume from (None: start fresh) and the newer ones rejected as corrupt on the way."""

    checkpoint: Path | None
    rejected: list[Verdict] = field(default_factory=list)


def _named(run_dir: Path) -> tuple[Path | None, list[Path]]:
    """The checkpoint `latest` names, else the newest complete one, else None (after repairing what an
    interrupted re-save left); and every complete checkpoint, oldest first."""
    root = run_dir / CHECKPOINTS_DIR
    _repair(root)
    pointer = root / LATEST_FILE
    found = list_checkpoints(run_dir)
    if pointer.exists():
        target = root / pointer.read_text().strip()
        if (target / TRAINER_STATE_FILE).exists():
            return target, found
        if not found:
            raise CheckpointError(
                f"{pointer} names '{target.name}', which is missing or incomplete, and there is no other "
                "complete checkpoint. Fix: set trainer.resume=off to start over"
            )
        log.warning(
            "%s names '%s', which is missing or incomplete; resuming from the newest complete checkpoint, "
            "%s (complete: %s)",
            pointer,
            target.name,
            found[-1].name,
            [p.name for p in found],
        )
    return (found[-1] if found else None), found


def _accepted(verdict: Verdict) -> bool:
    """Log the verdict of a checkpoint about to be resumed; True when it may be used."""
    if verdict.status == "ok":
        log.info("checkpoint %s", verdict.describe())
    elif verdict.status == "unverified":
        log.warning("checkpoint %s", verdict.describe())
    return verdict.status != "bad"


def _latest(run_dir: Path) -> ResumeChoice:
    """The newest sound checkpoint from the one `latest` names down: one whose manifest does not match is
    named and skipped for the next older complete one."""
    target, found = _named(run_dir)
    if target is None:
        return ResumeChoice(None)
    older = found[: found.index(target)] if target in found else found
    candidates = [target, *reversed(older)]
    rejected: list[Verdict] = []
    for candidate in candidates:
        verdict = verify_checkpoint(candidate)
        if _accepted(verdict):
            if rejected:
                log.warning(
                    "resuming from %s, the newest checkpoint that matches its manifest; rejected: %s",
                    candidate.name,
                    " | ".join(v.describe() for v in rejected),
                )
            return ResumeChoice(candidate, rejected)
        log.warning("checkpoint %s does not match its manifest: %s", candidate.name, verdict.describe())
        rejected.append(verdict)
    raise CheckpointError(
        "no checkpoint matches its manifest: "
        + " | ".join(v.describe() for v in rejected)
        + ". Fix: restore the named files from a copy, or set trainer.resume=off to start over"
    )


def choose_resume_checkpoint(resume: str, run_dir: Path) -> ResumeChoice:
    """The checkpoint `trainer.resume` asks for, checked against its manifest: `auto` (the newest sound one,
    if any), `off` (None), or a folder (refused when it does not match its manifest)."""
    if resume == "off":
        return ResumeChoice(None)
    if resume == "auto":
        return _latest(run_dir)
    path = Path(resume).expanduser()
    # a run folder or its checkpoints folder
    if (path / CHECKPOINTS_DIR).is_dir() or (path / LATEST_FILE).exists():
        choice = _latest(path if (path / CHECKPOINTS_DIR).is_dir() else path.parent)
        if choice.checkpoint is None:
            raise CheckpointError(f"trainer.resume={resume}: the run folder has no checkpoint")
        return choice
    if not (path / TRAINER_STATE_FILE).exists():
        raise CheckpointError(
            f"trainer.resume={resume} is not a checkpoint folder (no {TRAINER_STATE_FILE} in it). Fix: "
            "give a '.../checkpoints/global_step_N' folder, or trainer.resume=auto|off"
        )
    verdict = verify_checkpoint(path)
    if not _accepted(verdict):
        raise CheckpointError(
            f"trainer.resume={resume} does not match its manifest: {verdict.describe()}. Fix: restore the "
            "named files from a copy, or give an older checkpoint folder"
        )
    return ResumeChoice(path)


def find_resume_checkpoint(resume: str, run_dir: Path) -> Path | None:
    """The checkpoint `trainer.resume` asks for (`choose_resume_checkpoint` without the rejected ones)."""
    return choose_resume_checkpoint(resume, run_dir).checkpoint


def load_trainer_state(
    checkpoint: Path, world_size: int, layout: dict[str, int] | None = None
) -> TrainerState:
    """The driver's state of `checkpoint`. It may have been written on another world size or layout (the
    roles reshard on load, `quartet.engines.elastic`); one line says so, and what is not carried exactly."""
    raw = json.loads((checkpoint / TRAINER_STATE_FILE).read_text())
    state = TrainerState(**raw)
    change = world_change(state, world_size, layout or {})
    if change is not None:
        log.warning("resuming %s: %s", checkpoint, change)
    return state


def layout_label(world_size: int, layout: dict[str, int]) -> str:
    """E.g. "4 rank(s) (dp2 x sp2)": the world and its parallel sizes above 1 (dp always)."""
    parts = [f"{k}{v}" for k, v in layout.items() if k == "dp" or v > 1]
    return f"{world_size} rank(s)" + (f" ({' x '.join(parts)})" if parts else "")


def world_change(state: TrainerState, world_size: int, layout: dict[str, int]) -> str | None:
    """What changed between the world that wrote `state` and this one, and what that does not carry
    exactly; None when nothing changed (a checkpoint without a layout is compared by world size only)."""
    same_layout = not state.layout or not layout or state.layout == layout
    if state.world_size == world_size and same_layout:
        return None
    was, now = layout_label(state.world_size, state.layout), layout_label(world_size, layout)
    inexact = (
        "per-rank RNG streams (torch RNG, mini-batch shuffling) of ranks "
        f"{list(range(state.world_size, world_size))} seeded from (seed, step, rank)"
        if world_size > state.world_size
        else f"per-rank RNG streams of ranks {list(range(world_size, state.world_size))} dropped"
        if world_size < state.world_size
        else "nothing"
    )
    return (
        f"the world changed from {was} to {now}: parameters and optimizer states resharded exactly, "
        "scheduler, step counters, role counters, sampler position and KL controller carried exactly; "
        f"not carried exactly: {inexact}"
    )
