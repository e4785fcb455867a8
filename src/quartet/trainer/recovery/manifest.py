"""A checkpoint's integrity manifest: every file's size and sha256, written last, checked before a resume.

`manifest.json` in a checkpoint folder:

    {"format": 1, "step": N, "algorithm": "sha256",
     "files": {"actor/model/__0_0.distcp": {"size": 123, "sha256": "..."}, ...}}

`write_manifest` is called once every other file of the checkpoint is complete (the roles' shards, the
trainer state, the config), writes to a temporary file and renames it in, so a manifest is either absent or
whole. `verify_checkpoint` compares the folder against it: every listed file's size first (cheap, and what
a truncated or missing file breaks), then, only when every size agrees, every hash (what a flipped byte
breaks). A checkpoint without a manifest (written before manifests existed) is `unverified`, not bad.

Why sha256: with the CPU's SHA extensions it hashes about 1.2 GB/s per core (docs/reliability.md,
"Integrity"), faster than blake2b there, and it is what `sha256sum` prints, so a file can be checked by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quartet.tracking.run_layout import MANIFEST_FILE

__all__ = [
    "MANIFEST_FORMAT",
    "Problem",
    "Verdict",
    "file_sha256",
    "verify_checkpoint",
    "write_manifest",
]

MANIFEST_FORMAT = 1
"""The manifest's layout version; a reader refuses a manifest of a version it does not know."""
_CHUNK = 8 << 20  # bytes read per hash update


@dataclass(frozen=True)
class Problem:
    """One file that does not match the manifest: what was expected and what was found."""

    file: str
    """Path relative to the checkpoint folder."""
    what: Literal["missing", "size", "sha256", "manifest"]
    expected: str
    found: str

    def __str__(self) -> str:
        return f"{self.file}: {self.what} expected {self.expected}, found {self.found}"


@dataclass
class Verdict:
    """The result of checking one checkpoint folder against its manifest."""

    folder: Path
    status: Literal["ok", "unverified", "bad"]
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    """Files the manifest lists."""
    bytes: int = 0
    """Bytes the manifest lists."""

    def describe(self) -> str:
        """One line: ok with the count, no manifest, or the bad files with expected and found."""
        if self.status == "ok":
            return (
                f"{self.folder.name}: ok ({self.files} files, {self.bytes / 1e6:.1f} MB match the manifest)"
            )
        if self.status == "unverified":
            return f"{self.folder.name}: no {MANIFEST_FILE} (written before manifests); not verified"
        return f"{self.folder.name}: " + "; ".join(str(p) for p in self.problems)


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file's bytes, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[Path]:
    """Every regular file under `folder` except the manifest and its temporary file, sorted by path."""
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and p.name not in (MANIFEST_FILE, f".{MANIFEST_FILE}.tmp")
    )


def write_manifest(folder: Path, step: int) -> dict[str, Any]:
    """Hash every file of the checkpoint `folder` and write `manifest.json` atomically (temporary file,
    flushed, renamed in); returns the manifest. Call it after every other file of the checkpoint is
    complete."""
    files = {
        p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in _files(folder)
    }
    manifest = {"format": MANIFEST_FORMAT, "step": step, "algorithm": "sha256", "files": files}
    tmp = folder / f".{MANIFEST_FILE}.tmp"
    with tmp.open("w") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, folder / MANIFEST_FILE)
    return manifest


def _read_manifest(folder: Path) -> tuple[dict[str, Any] | None, Problem | None]:
    """The manifest, or the problem that makes it unreadable."""
    path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return None, Problem(MANIFEST_FILE, "manifest", "readable JSON", f"{type(err).__name__}: {err}")
    fmt = manifest.get("format") if isinstance(manifest, dict) else None
    if fmt != MANIFEST_FORMAT or not isinstance(manifest.get("files"), dict):
        return None, Problem(
            MANIFEST_FILE, "manifest", f"format {MANIFEST_FORMAT} with files", f"format {fmt}"
        )
    return manifest, None


def verify_checkpoint(folder: Path) -> Verdict:
    """Check `folder` against its manifest: sizes of every listed file first, then (all sizes agreeing)
    their sha256. Files the manifest does not list are not checked."""
    if not (folder / MANIFEST_FILE).exists():
        return Verdict(folder, "unverified")
    manifest, bad = _read_manifest(folder)
    if manifest is None:
        assert bad is not None
        return Verdict(folder, "bad", [bad])
    listed: dict[str, dict[str, Any]] = manifest["files"]
    verdict = Verdict(folder, "ok", files=len(listed), bytes=sum(int(e["size"]) for e in listed.values()))
    for name, entry in listed.items():
        path = folder / name
        if not path.is_file():
            verdict.problems.append(Problem(name, "missing", f"{entry['size']} bytes", "no file"))
        elif (size := path.stat().st_size) != entry["size"]:
            verdict.problems.append(Problem(name, "size", f"{entry['size']} bytes", f"{size} bytes"))
    if not verdict.problems:
        for name, entry in listed.items():
            if (digest := file_sha256(folder / name)) != entry["sha256"]:
                verdict.problems.append(Problem(name, "sha256", entry["sha256"], digest))
    if verdict.problems:
        verdict.status = "bad"
    return verdict
