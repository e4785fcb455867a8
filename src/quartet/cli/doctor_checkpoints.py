"""`quartet doctor --run-dir`: every checkpoint of the run checked against its manifest, one check each.

A checkpoint whose files match `manifest.json` (sizes, then sha256) is ok; one without a manifest (written
before manifests existed) is a warning; one with a missing, truncated or changed file is a failure naming
the file, what was expected and what was found (`quartet.trainer.recovery.manifest`).
"""

from __future__ import annotations

from pathlib import Path

from quartet.cli.doctor_checks import Check
from quartet.trainer.recovery.checkpoint import list_checkpoints
from quartet.trainer.recovery.manifest import verify_checkpoint

__all__ = ["checkpoint_checks"]

RESTORE_FIX = (
    "restore the named files from a copy, or delete the folder: resuming (trainer.resume=auto) skips it for "
    "the newest checkpoint that matches its manifest"
)


def checkpoint_checks(run_dir: Path) -> list[Check]:
    """One check per complete checkpoint of `run_dir`, oldest first; one warning when there is none."""
    found = list_checkpoints(run_dir)
    if not found:
        return [Check("checkpoints", "warn", f"no complete checkpoint in {run_dir}", "")]
    out = []
    for folder in found:
        verdict = verify_checkpoint(folder)
        name = f"checkpoint {folder.name}"
        if verdict.status == "ok":
            out.append(Check(name, "ok", verdict.describe()))
        elif verdict.status == "unverified":
            out.append(Check(name, "warn", verdict.describe(), "the next save writes a manifest"))
        else:
            out.append(Check(name, "fail", verdict.describe(), RESTORE_FIX))
    return out
