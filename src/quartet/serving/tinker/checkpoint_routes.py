"""The Tinker service's checkpoint calls: save / load (futures, on the model's thread) and the REST calls.

Futures: `save_weights` (`save_state`: adapter and AdamW state, `tinker://<model_id>/weights/<name>`),
`save_weights_for_sampler` with a name (adapter only, `.../sampler_weights/<name>`), `load_weights` in
both of the SDK's forms: into an existing model (`load_state[_with_optimizer]`), or creating the model
from the checkpoint (`create_training_client_from_state[_with_optimizer]`: no `model_id`, the new model is
`<session_id>:train:<model_seq_id>`, rebuilt from the run record the checkpoint carries, so it works after
a restart of the service). REST (the SDK's `RestClient`): `weights_info`, `training_runs` (list, one),
`training_runs/<id>/checkpoints` (list), `checkpoints` (all), DELETE of one checkpoint. Not served, a 400
naming itself: publish / unpublish, TTL changes, external weights URLs, and `save_weights_for_sampler`
without a name (a sampling session; the sampler's part of issue 51).

Every check that can fail before the work runs answers at once (400 naming the field, 404 for a path or
model that does not exist); what fails while running reaches the SDK as `RequestFailedError`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from quartet.serving.tinker.backend import LoraModel, NotServedError, lora_spec
from quartet.serving.tinker.checkpoints import (
    SAMPLER,
    TRAINING,
    CheckpointStore,
    RunRecord,
    check_model_id,
    iso_time,
    metadata_strings,
    parse_path,
)
from quartet.serving.tinker.wire import WireError

__all__ = ["CheckpointRoutes", "Host"]


class Host(Protocol):
    """What the routes need of the server (TinkerServer provides it)."""

    @property
    def models(self) -> Mapping[str, Path]: ...  # base model name -> local folder

    @property
    def store(self) -> CheckpointStore: ...

    def _model(self, model_id: object) -> Any: ...  # an entry with `.model` (LoraModel) and `.worker`

    def _future(self, work: concurrent.futures.Future[Any], model_id: str) -> web.Response: ...

    def _build_model(
        self, model_id: str, make: Callable[[], LoraModel], record: RunRecord, reply: dict[str, Any]
    ) -> concurrent.futures.Future[dict[str, Any]]: ...


class CheckpointRoutes:
    """Registers the checkpoint handlers on `host`'s router (before its catch-all route)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.store = host.store

    def add_to(self, router: web.UrlDispatcher) -> None:
        """Add the routes; call before any catch-all route."""
        router.add_post("/api/v1/save_weights", self._save_weights)
        router.add_post("/api/v1/save_weights_for_sampler", self._save_for_sampler)
        router.add_post("/api/v1/load_weights", self._load_weights)
        router.add_post("/api/v1/weights_info", self._weights_info)
        router.add_get("/api/v1/training_runs", self._training_runs)
        router.add_get("/api/v1/training_runs/{run_id}", self._training_run)
        router.add_get("/api/v1/training_runs/{run_id}/checkpoints", self._checkpoints)
        router.add_delete("/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}", self._delete)
        router.add_get("/api/v1/checkpoints", self._all_checkpoints)
        action = "/api/v1/training_runs/{run_id}/checkpoints/{kind}/{name}/{action}"
        router.add_route("*", action, _not_served)  # publish, ttl, external_weights_urls

    # ---- futures ------------------------------------------------------------------------------------

    async def _save_weights(self, request: web.Request) -> web.Response:
        return await self._save(request, TRAINING)

    async def _save_for_sampler(self, request: web.Request) -> web.Response:
        return await self._save(request, SAMPLER)

    async def _save(self, request: web.Request, kind: str) -> web.Response:
        body = await _json(request)
        entry = self.host._model(body.get("model_id"))
        model_id = str(body["model_id"])
        if kind == SAMPLER and body.get("path") is None:
            raise NotServedError(
                "save_weights_for_sampler without a name (a sampling session) is not served yet"
            )
        overwrite = body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise WireError("overwrite", "must be true or false")
        ckpt = self.store.check_save(model_id, kind, body.get("path"), overwrite)
        meta = {"user_metadata": _metadata(body), "expires_at": _expiry(body)}

        def run() -> dict[str, Any]:
            adapter, optimizer = entry.model.state()
            saved = self.store.save(
                model_id, kind, ckpt.name, adapter, optimizer if kind == TRAINING else None, meta, overwrite
            )
            return {"type": "save_weights" if kind == TRAINING else "save_weights_for_sampler",
                    "path": saved.tinker_path}  # fmt: skip

        return self.host._future(entry.worker.submit(run), model_id)

    async def _load_weights(self, request: web.Request) -> web.Response:
        body = await _json(request)
        path = body.get("path")
        optimizer = body.get("optimizer", False)
        if not isinstance(optimizer, bool):
            raise WireError("optimizer", "must be true or false")
        ckpt = parse_path(path)
        if ckpt.kind != TRAINING:
            raise WireError("path", f"{ckpt.tinker_path} is a sampler checkpoint; loading needs weights/")
        meta = self.store.info(path)  # 400 / 404 now for a path that is hostile or absent
        source = RunRecord(**meta["run"])
        if optimizer and meta.get("optimizer") is None:
            raise WireError("path", f"{ckpt.tinker_path} holds no optimizer state")
        if body.get("model_id") is None:
            return self._create_from(body, str(path), source, optimizer)
        entry = self.host._model(body.get("model_id"))
        model_id = str(body["model_id"])
        target = self.store.run(model_id)
        for field in ("base_model", "lora_rank", "train_attn", "train_mlp"):
            if getattr(target, field) != getattr(source, field):
                raise WireError("path", f"the checkpoint's {field} {getattr(source, field)!r} differs "
                                f"from this model's {getattr(target, field)!r}")  # fmt: skip

        def run() -> dict[str, Any]:
            adapter, state, _ = self.store.load(path, optimizer=optimizer)
            entry.model.load(adapter, state if optimizer else None)
            return {"type": "load_weights", "path": path, "model_id": model_id}

        return self.host._future(entry.worker.submit(run), model_id)

    def _create_from(
        self, body: Mapping[str, Any], path: str, source: RunRecord, optimizer: bool
    ) -> web.Response:
        """`create_training_client_from_state[_with_optimizer]`: a new model built from the checkpoint."""
        session_id, seq = body.get("session_id"), body.get("model_seq_id")
        if not isinstance(session_id, str) or not isinstance(seq, int) or isinstance(seq, bool):
            raise WireError("session_id", "load_weights needs model_id, or session_id and model_seq_id")
        model_id = check_model_id(f"{session_id}:train:{seq}", "session_id")
        base = body.get("base_model")
        if base is not None and base != source.base_model:
            raise WireError("base_model", f"overriding the checkpoint's base model {source.base_model!r} "
                            "is not served")  # fmt: skip
        if source.base_model not in self.host.models:
            raise WireError("path", f"the checkpoint's base model {source.base_model!r} is not served here "
                            f"(served: {sorted(self.host.models)})")  # fmt: skip
        metadata = metadata_strings(body.get("user_metadata"))
        record = dataclasses.replace(source, model_id=model_id, created=time.time(), user_metadata=metadata)
        folder = self.host.models[source.base_model]

        def make() -> LoraModel:
            spec = lora_spec(folder, source.lora_rank, source.seed, source.train_attn, source.train_mlp)
            model = LoraModel(spec)
            adapter, state, _ = self.store.load(path, optimizer=optimizer)
            model.load(adapter, state if optimizer else None)
            return model

        reply = {"type": "load_weights", "path": path, "model_id": model_id}
        return self.host._future(self.host._build_model(model_id, make, record, reply), model_id)

    # ---- REST ---------------------------------------------------------------------------------------

    async def _weights_info(self, request: web.Request) -> web.Response:
        body = await _json(request)
        return web.json_response(self.store.weights_info(body.get("tinker_path")))

    def _run(self, record: RunRecord) -> dict[str, Any]:
        """The SDK's `TrainingRun` of a registered run."""
        checkpoints = self.store.list(record.model_id)
        last = {k: [c for c in checkpoints if c["checkpoint_type"] == k] for k in ("training", "sampler")}
        return {
            "training_run_id": record.model_id,
            "base_model": record.base_model,
            "model_owner": "local",
            "is_lora": True,
            "corrupted": False,
            "lora_rank": record.lora_rank,
            "last_request_time": max([iso_time(record.created)] + [c["time"] for c in checkpoints]),
            "last_checkpoint": last["training"][-1] if last["training"] else None,
            "last_sampler_checkpoint": last["sampler"][-1] if last["sampler"] else None,
            "user_metadata": record.user_metadata,
        }

    async def _training_runs(self, request: web.Request) -> web.Response:
        offset, limit = _page(request, 20)
        runs = self.store.runs()
        page = [self._run(r) for r in runs[offset : offset + limit]]
        cursor = {"offset": offset, "limit": limit, "total_count": len(runs)}
        return web.json_response({"training_runs": page, "cursor": cursor})

    async def _training_run(self, request: web.Request) -> web.Response:
        record = self.store.run(request.match_info["run_id"], "training_run_id")
        return web.json_response(self._run(record))

    async def _checkpoints(self, request: web.Request) -> web.Response:
        listed = self.store.list(request.match_info["run_id"])
        return web.json_response({"checkpoints": listed, "cursor": None})

    async def _all_checkpoints(self, request: web.Request) -> web.Response:
        offset, limit = _page(request, 100)
        every = [c for r in self.store.runs() for c in self.store.list(r.model_id)]
        every.sort(key=lambda c: (c["time"], c["tinker_path"]), reverse=True)  # newest first
        cursor = {"offset": offset, "limit": limit, "total_count": len(every)}
        return web.json_response({"checkpoints": every[offset : offset + limit], "cursor": cursor})

    async def _delete(self, request: web.Request) -> web.Response:
        info = request.match_info
        self.store.delete(f"tinker://{info['run_id']}/{info['kind']}/{info['name']}")
        return web.json_response({})


async def _not_served(request: web.Request) -> web.Response:
    action = request.match_info["action"]
    raise NotServedError(
        f"{request.method} checkpoints/.../{action} is not served by quartet's Tinker service "
        "(checkpoints are files on the service's machine: no publishing, TTL changes or download URLs)"
    )


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as err:
        raise WireError("body", f"the body is not JSON: {err}") from err
    if not isinstance(body, dict):
        raise WireError("body", "the body must be a JSON object")
    return body


def _metadata(body: Mapping[str, Any]) -> dict[str, str] | None:
    """`user_metadata`: None or a flat mapping of strings (the SDK's type)."""
    value = body.get("user_metadata")
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise WireError("user_metadata", "must map strings to strings")
    return dict(value)


def _expiry(body: Mapping[str, Any]) -> float | None:
    """`ttl_seconds` as an expiry time (recorded and listed; nothing is deleted when it passes)."""
    ttl = body.get("ttl_seconds")
    if ttl is None:
        return None
    if not isinstance(ttl, int) or isinstance(ttl, bool) or ttl <= 0:
        raise WireError("ttl_seconds", "must be a positive integer or null")
    return time.time() + ttl


def _page(request: web.Request, default_limit: int) -> tuple[int, int]:
    """(offset, limit) of a paged REST call; 400 naming the parameter when it is not a count."""
    values = []
    for name, default in (("offset", 0), ("limit", default_limit)):
        raw = request.query.get(name, str(default))
        if not raw.isdigit() or len(raw) > 9:
            raise WireError(name, f"must be a non-negative integer, not {raw[:20]!r}")
        values.append(int(raw))
    return values[0], values[1]
