"""Checkpoints of the Tinker service: `tinker://` paths confined to one folder, written atomically, no pickle.

A path is `tinker://<model_id>/<kind>/<name>` (the SDK's grammar: exactly three parts), kind `weights` (a
training checkpoint, `save_state`: adapter and optionally AdamW state) or `sampler_weights` (for sampling,
`save_weights_for_sampler`: adapter only). On disk, under `root`:

    <model_id>/run.json                  the run's creation record, written at create_model
    <model_id>/<kind>/<name>/            adapter.safetensors, [optimizer.safetensors], meta.json

CONFINEMENT: every part of a path is checked against a strict pattern (no `/`, no NUL, no `..`, no leading
dot, at most 128 characters), the folder built from the parts must hold no symlink between `root` and
the file, and files are opened with `O_NOFOLLOW`: a hostile path answers `WireError` naming the field
(`MissingError`, a 404, where it is well formed but absent), and no file operation happens outside `root`.

Tensors are stored with safetensors; the optimizer state's tree (torch's `state_dict` layout) is JSON with
its tensors in a safetensors file, so loading never unpickles anything. A save goes to a hidden temporary
folder first, then is renamed into place. Overwrite policy (the SDK's `overwrite` flag, default False): an
existing name is refused (400 naming `path`) unless the save says `overwrite=True`, which replaces the
whole checkpoint, its user metadata included.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from quartet.serving.tinker.wire import WireError

__all__ = [
    "KINDS",
    "SAMPLER",
    "TRAINING",
    "CheckpointPath",
    "CheckpointStore",
    "MissingError",
    "RunRecord",
    "check_model_id",
    "check_part",
    "iso_time",
    "metadata_strings",
    "parse_path",
]

TRAINING = "weights"
SAMPLER = "sampler_weights"
KINDS = {TRAINING: "training", SAMPLER: "sampler"}
"""Path segment -> the SDK's `checkpoint_type`."""

_PREFIX = "tinker://"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # `session:train:0` ids carry colons
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_MAX_PATH = 512
_LEFTOVER = re.compile(r"\.(tmp|old|del)-[0-9a-f]{32}|\.run\.json\.[0-9a-f]{32}")
"""What an interrupted save, overwrite, delete or run registration leaves behind (see `sweep`)."""
_ADAPTER = "adapter.safetensors"
_OPTIMIZER = "optimizer.safetensors"
_META = "meta.json"
_RUN = "run.json"


class MissingError(WireError):
    """A well-formed path or id that names nothing in the store (the server answers 404)."""


@dataclasses.dataclass(frozen=True)
class CheckpointPath:
    """One checkpoint's address: `tinker://<model_id>/<kind>/<name>`."""

    model_id: str
    kind: str
    name: str

    @property
    def tinker_path(self) -> str:
        return f"{_PREFIX}{self.model_id}/{self.kind}/{self.name}"

    @property
    def checkpoint_id(self) -> str:
        """The SDK's `checkpoint_id`: `<kind>/<name>`."""
        return f"{self.kind}/{self.name}"


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """What `create_model` was asked for: enough to rebuild the model after a restart of the service."""

    model_id: str
    base_model: str
    lora_rank: int
    seed: int
    train_attn: bool
    train_mlp: bool
    train_unembed: bool
    created: float = dataclasses.field(default_factory=time.time)
    user_metadata: dict[str, str] | None = None


def _show(text: str) -> str:
    """`text` for a message: short, so a 10k-character name is not echoed back whole."""
    return repr(text if len(text) <= 60 else text[:60] + "...")


def check_part(value: object, pattern: re.Pattern[str], field: str, what: str) -> str:
    """`value` if it is a string matching `pattern` whole; else `WireError(field)`."""
    if not isinstance(value, str):
        raise WireError(field, f"{what} must be a string")
    if not pattern.fullmatch(value):
        raise WireError(
            field,
            f"{what} {_show(value)} is not allowed: 1-128 characters of letters, digits and ._-"
            + (":" if pattern is _RUN_ID else "")
            + ", starting with a letter or digit",
        )
    return value


def parse_path(text: object, field: str = "path") -> CheckpointPath:
    """The parts of a `tinker://<model_id>/<weights|sampler_weights>/<name>` path; `WireError(field)` else."""
    if not isinstance(text, str):
        raise WireError(field, "must be a string tinker://<model_id>/<kind>/<name>")
    if len(text) > _MAX_PATH:
        raise WireError(field, f"{len(text)} characters (at most {_MAX_PATH})")
    if not text.startswith(_PREFIX):
        raise WireError(field, f"{_show(text)} is not a tinker://<model_id>/<kind>/<name> path")
    parts = text[len(_PREFIX) :].split("/")
    if len(parts) != 3:
        raise WireError(field, f"{_show(text)} must have exactly three parts <model_id>/<kind>/<name>")
    model_id, kind, name = parts
    check_part(model_id, _RUN_ID, field, "model_id")
    if kind not in KINDS:
        raise WireError(field, f"kind {_show(kind)} is not one of {sorted(KINDS)}")
    return CheckpointPath(model_id, kind, check_part(name, _NAME, field, "name"))


def check_model_id(value: object, field: str = "model_id") -> str:
    """`value` if it is an allowed model (training run) id; else `WireError(field)`."""
    return check_part(value, _RUN_ID, field, "model_id")


def metadata_strings(value: object, field: str = "user_metadata") -> dict[str, str] | None:
    """A run's `user_metadata` as the SDK's `TrainingRun` shows it (strings to strings): requests may send
    any JSON values (`CreateModelRequest`), which are kept as their JSON text. `WireError` if not a map."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise WireError(field, "must be a JSON object")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}


def iso_time(stamp: float | None) -> str | None:
    """An epoch time as the ISO 8601 (UTC) text the SDK's datetimes parse."""
    return None if stamp is None else datetime.datetime.fromtimestamp(stamp, datetime.UTC).isoformat()


class CheckpointStore:
    """Checkpoints and run records under one folder (`--state-dir`); safe to share between threads."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self._lock = threading.Lock()

    def sweep(self) -> int:
        """Remove what an interrupted save, overwrite, delete or registration left (hidden temporary
        folders and files, never listed nor loaded); returns how many. Call it when the service starts,
        not while another process writes to the same folder."""
        removed = 0
        for run_dir in self.root.iterdir():
            if not _RUN_ID.fullmatch(run_dir.name) or run_dir.is_symlink() or not run_dir.is_dir():
                continue
            for entry in [run_dir, *(run_dir / kind for kind in KINDS)]:
                if entry.is_symlink() or not entry.is_dir():
                    continue
                for leftover in entry.iterdir():
                    if not _LEFTOVER.fullmatch(leftover.name) or leftover.is_symlink():
                        continue
                    if leftover.is_dir():
                        shutil.rmtree(leftover, ignore_errors=True)
                    else:
                        leftover.unlink(missing_ok=True)
                    removed += 1
        return removed

    # ---- confinement --------------------------------------------------------------------------------

    def _inside(self, *parts: str, field: str, create: bool = False) -> Path:
        """`root/parts...` after checking that no part is a symlink and the result lies under root."""
        path = self.root
        for part in parts:
            if part in ("", ".", "..") or "/" in part or "\x00" in part:  # the patterns exclude these too
                raise WireError(field, f"{_show(part)} is not a path part")
            path = path / part
            if path.is_symlink():
                raise WireError(field, f"{_show(part)} is a symbolic link in the store: refused")
            if create and not path.exists():
                path.mkdir(exist_ok=True)
        if not os.path.realpath(path).startswith(str(self.root) + os.sep):
            raise WireError(field, "resolves outside the service's checkpoint folder: refused")
        return path

    def _read(self, path: Path) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def _checkpoint_dir(self, ckpt: CheckpointPath, field: str = "path") -> Path:
        """The folder of an existing checkpoint, none of whose files is a symlink (a cheap look at the
        folder, so that a request can be refused before any work is queued); `MissingError` if absent."""
        self.run(ckpt.model_id, field)
        folder = self._inside(ckpt.model_id, ckpt.kind, ckpt.name, field=field)
        if not (folder / _META).is_file():
            raise MissingError(field, f"no checkpoint {ckpt.tinker_path} (never saved, or deleted)")
        if any(entry.is_symlink() for entry in folder.iterdir()):
            raise WireError(field, f"{ckpt.tinker_path} holds a symbolic link: refused")
        return folder

    def info(self, path: object, kind: str | None = TRAINING) -> dict[str, Any]:
        """The meta record of the checkpoint at `path` (reads meta.json only: cheap enough for the event
        loop), after the checks `load` makes."""
        folder = self._checkpoint_dir(self._of_kind(path, kind))
        try:
            meta: dict[str, Any] = json.loads(self._read(folder / _META))
        except FileNotFoundError as err:
            raise MissingError("path", "the checkpoint was deleted while being read") from err
        return meta

    def _of_kind(self, path: object, kind: str | None) -> CheckpointPath:
        ckpt = parse_path(path)
        if kind is not None and ckpt.kind != kind:
            raise WireError("path", f"{ckpt.tinker_path} is a {KINDS[ckpt.kind]} checkpoint, not {kind}")
        return ckpt

    # ---- runs ---------------------------------------------------------------------------------------

    def register_run(self, record: RunRecord) -> None:
        """Write `record` (atomically) so that the run's checkpoints can be loaded after a restart."""
        check_part(record.model_id, _RUN_ID, "model_id", "model_id")
        folder = self._inside(record.model_id, field="model_id", create=True)
        _write_atomic(folder / _RUN, json.dumps(dataclasses.asdict(record)).encode())

    def run(self, model_id: object, field: str = "model_id") -> RunRecord:
        """The creation record of `model_id`; `MissingError(field)` for a run this store never saw."""
        model_id = check_part(model_id, _RUN_ID, field, "model_id")
        file = self._inside(model_id, _RUN, field=field)
        if not file.is_file():
            raise MissingError(field, f"no training run {_show(model_id)} in this service")
        return RunRecord(**json.loads(self._read(file)))

    def runs(self) -> list[RunRecord]:
        """Every registered run, oldest first."""
        found = []
        for entry in self.root.iterdir():
            if _RUN_ID.fullmatch(entry.name) and not entry.is_symlink() and (entry / _RUN).is_file():
                found.append(self.run(entry.name))
        return sorted(found, key=lambda r: (r.created, r.model_id))

    # ---- checkpoints --------------------------------------------------------------------------------

    def check_save(self, model_id: str, kind: str, name: object, overwrite: bool) -> CheckpointPath:
        """The path a save would write, after every check that can fail before the save runs."""
        if kind not in KINDS:
            raise WireError("kind", f"{_show(kind)} is not one of {sorted(KINDS)}")
        ckpt = CheckpointPath(model_id, kind, check_part(name, _NAME, "path", "name"))
        self.run(model_id)
        folder = self._inside(model_id, kind, ckpt.name, field="path")
        if not overwrite and folder.exists():
            raise WireError("path", f"{ckpt.tinker_path} exists; save with overwrite=True to replace it")
        return ckpt

    def save(
        self,
        model_id: str,
        kind: str,
        name: object,
        adapter: Mapping[str, torch.Tensor],
        optimizer_state: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> CheckpointPath:
        """Write a checkpoint (see the module's overwrite policy); returns its path.

        `meta` holds the caller's extra fields (`user_metadata`, `expires_at`); the run's record is copied
        into the checkpoint so that it alone says how to rebuild the model.
        """
        ckpt = self.check_save(model_id, kind, name, overwrite)
        record = self.run(model_id)
        kind_dir = self._inside(model_id, kind, field="path", create=True)
        tmp = kind_dir / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            _write_atomic(tmp / _ADAPTER, save_safetensors(_contiguous(adapter)))
            tree = None
            if optimizer_state is not None:
                tensors: dict[str, torch.Tensor] = {}
                tree = _flatten(optimizer_state, tensors)
                _write_atomic(tmp / _OPTIMIZER, save_safetensors(tensors))
            size = sum(f.stat().st_size for f in tmp.iterdir())  # the tensor files (meta.json aside)
            info = {**(meta or {}), "format": 1, "created": time.time(), "size_bytes": size}
            info.update(run=dataclasses.asdict(record), optimizer=tree, tinker_path=ckpt.tinker_path)
            _write_atomic(tmp / _META, json.dumps(info).encode())
            with self._lock:
                final = self._inside(model_id, kind, ckpt.name, field="path")
                if final.exists() and not overwrite:
                    raise WireError("path", f"{ckpt.tinker_path} exists; save with overwrite=True")
                old = kind_dir / f".old-{uuid.uuid4().hex}"
                if final.exists():
                    os.rename(final, old)
                os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return ckpt

    def load(
        self, path: object, kind: str | None = TRAINING, optimizer: bool = True
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, dict[str, Any]]:
        """(adapter, optimizer state or None, meta) of the checkpoint at `path`.

        `kind` refuses a checkpoint of another kind (None: either); `optimizer=False` skips reading the
        optimizer state. Absent: `MissingError`; malformed or hostile: `WireError`, both naming `path`.
        """
        ckpt = self._of_kind(path, kind)
        folder = self._checkpoint_dir(ckpt)
        try:
            meta: dict[str, Any] = json.loads(self._read(folder / _META))
            adapter = load_safetensors(self._read(folder / _ADAPTER))
            state = None
            if optimizer and meta.get("optimizer") is not None:
                state = _unflatten(meta["optimizer"], load_safetensors(self._read(folder / _OPTIMIZER)))
        except FileNotFoundError as err:  # deleted (or overwritten) while being read
            raise MissingError("path", f"{ckpt.tinker_path} was deleted while being read") from err
        except OSError as err:  # ELOOP: a file in the folder was replaced by a symbolic link
            raise WireError("path", f"{ckpt.tinker_path} cannot be read: {err.strerror}") from err
        return adapter, state, meta

    def resolve(self, model_path: object) -> tuple[str, int, dict[str, torch.Tensor]]:
        """(base model name, LoRA rank, adapter state) of a checkpoint of either kind: a sampler's needs."""
        adapter, _, meta = self.load(model_path, kind=None, optimizer=False)
        return str(meta["run"]["base_model"]), int(meta["run"]["lora_rank"]), adapter

    def delete(self, path: object) -> None:
        """Remove the checkpoint at `path` (gone at once: renamed away, then its files deleted)."""
        ckpt = parse_path(path)
        with self._lock:
            folder = self._checkpoint_dir(ckpt)
            doomed = folder.with_name(f".del-{uuid.uuid4().hex}")
            os.rename(folder, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def list(self, model_id: object) -> list[dict[str, Any]]:
        """The run's checkpoints in the SDK's `Checkpoint` shape (JSON-ready), oldest first."""
        record = self.run(model_id, "training_run_id")
        found = []
        for kind in KINDS:
            kind_dir = self._inside(record.model_id, kind, field="training_run_id")
            if not kind_dir.is_dir():
                continue
            for entry in kind_dir.iterdir():
                if not _NAME.fullmatch(entry.name) or entry.is_symlink():
                    continue
                try:
                    meta = json.loads(self._read(entry / _META))
                except (FileNotFoundError, NotADirectoryError):  # not a checkpoint, or deleted meanwhile
                    continue
                found.append(_checkpoint(CheckpointPath(record.model_id, kind, entry.name), meta))
        return sorted(found, key=lambda c: (c["time"], c["tinker_path"]))

    def weights_info(self, path: object) -> dict[str, Any]:
        """The SDK's `WeightsInfoResponse` of an existing checkpoint."""
        ckpt = parse_path(path, "tinker_path")
        self._checkpoint_dir(ckpt, "tinker_path")
        run = self.run(ckpt.model_id, "tinker_path")
        return {"base_model": run.base_model, "is_lora": True, "lora_rank": run.lora_rank,
                "train_unembed": run.train_unembed, "train_mlp": run.train_mlp,
                "train_attn": run.train_attn}  # fmt: skip


def _checkpoint(ckpt: CheckpointPath, meta: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "checkpoint_id": ckpt.checkpoint_id,
        "checkpoint_type": KINDS[ckpt.kind],
        "time": iso_time(meta["created"]),
        "tinker_path": ckpt.tinker_path,
        "size_bytes": meta.get("size_bytes"),
        "public": False,
        "user_metadata": meta.get("user_metadata"),
        "expires_at": iso_time(meta.get("expires_at")),
    }


def _write_atomic(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file in the same folder, flushed to disk, then renamed."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _contiguous(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in tensors.items()}


def _flatten(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """`obj` (dicts with string keys, lists, tensors, JSON scalars) as JSON; tensors go to `tensors`."""
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, Mapping):
        if not all(isinstance(k, str) for k in obj) or "__tensor__" in obj:
            raise TypeError("optimizer state: dict keys must be strings (and not '__tensor__')")
        return {k: _flatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_flatten(v, tensors) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"optimizer state: a {type(obj).__name__} cannot be stored")


def _unflatten(obj: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return tensors[obj["__tensor__"]]
        return {k: _unflatten(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    return obj
