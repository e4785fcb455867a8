"""The Tinker service's checkpoint calls: save / load (futures, on the model's thread) and the REST calls.

Futures: `save_weights` (`save_state`: adapter and AdamW state, `tinker://<model_id>/weights/<name>`),
`save_weights_for_sampler` with a name (adapter only, `.../sampler_weights/<name>`), `load_weights` in
both of the SDK's forms: into an existing model (`load_state[_with_optimizer]`), or creating the model
from the checkpoint (`create_training_client_from_state[_with_optimizer]`: no `model_id`, the new model is
`<session_id>:train:<model_seq_id>`, rebuilt from the run record the checkpoint carries, so it works after
a restart of the service). REST (the SDK's `RestClient`): `weights_info`, `training_runs` (list, one),
`training_runs/<id>/checkpoints` (list), `checkpoints` (all), DELETE of one checkpoint. Not served, a 400
naming itself: publish / unpublish, TTL changes, external weights URLs. `save_weights_for_sampler` without
a name is a sampling session on an in-memory snapshot of the adapter (`SamplingRoutes.snapshot`).

Every check that can fail before the work runs answers at once (400 naming the field, 404 for a path or
model that does not exist); what fails while running reaches the SDK as `RequestFailedError`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from quartet.serving.tinker.adapters import AdapterHost, AdapterSpec
from quartet.serving.tinker.backend import NotServedError
from quartet.serving.tinker.checkpoints import (
    SAMPLER,
    TRAINING,
    RunRecord,
    check_model_id,
    iso_time,
    metadata_strings,
    parse_path,
)
from quartet.serving.tinker.http_body import future_response, json_body, then
from quartet.serving.tinker.wire import WireError

if TYPE_CHECKING:
    from quartet.serving.tinker.samplers import SamplingRoutes
    from quartet.serving.tinker.state import ServiceState

__all__ = ["CheckpointRoutes", "spec_of"]


def spec_of(record: RunRecord) -> AdapterSpec:
    """The adapter settings a run was created with."""
    return AdapterSpec(
        record.lora_rank, record.seed, record.train_attn, record.train_mlp, record.train_unembed
    )


class CheckpointRoutes:
    """The checkpoint handlers over a `ServiceState` (register before the app's catch-all route)."""

    def __init__(self, state: ServiceState, sampling: SamplingRoutes) -> None:
        self.state = state
        self.store = state.store
        self.sampling = sampling

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
        body = await json_body(request)
        entry = self.state.model(body.get("model_id"))
        model_id = entry.model_id
        if kind == SAMPLER and body.get("path") is None:  # save_weights_and_get_sampling_client
            return future_response(self.state, self.sampling.snapshot(model_id), model_id)
        overwrite = body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise WireError("overwrite", "must be true or false")
        ckpt = self.store.check_save(model_id, kind, body.get("path"), overwrite)
        meta = {"user_metadata": _metadata(body), "expires_at": _expiry(body)}

        store, training = self.store, kind == TRAINING

        def run() -> dict[str, Any]:
            # the weights are read on the model's thread (after every call sent before), written here
            adapter, optimizer = self.state.run_on_model(
                model_id, functools.partial(_state, model_id, training)
            ).result()
            saved = store.save(model_id, kind, ckpt.name, adapter, optimizer, meta, overwrite)
            return {
                "type": "save_weights" if training else "save_weights_for_sampler",
                "path": saved.tinker_path,
            }

        return future_response(self.state, self.state.builder.submit(run), model_id)

    async def _load_weights(self, request: web.Request) -> web.Response:
        body = await json_body(request)
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
        entry = self.state.model(body.get("model_id"))
        model_id = entry.model_id
        target = self.store.run(model_id)
        for field in ("base_model", "lora_rank", "train_attn", "train_mlp"):
            if getattr(target, field) != getattr(source, field):
                raise WireError("path", f"the checkpoint's {field} {getattr(source, field)!r} differs "
                                f"from this model's {getattr(target, field)!r}")  # fmt: skip

        adapter, state, _ = self.store.load(path, optimizer=optimizer)
        load = functools.partial(_load, model_id, adapter, state if optimizer else None)
        work = self.state.run_on_model(model_id, load)
        reply = {"type": "load_weights", "path": path, "model_id": model_id}
        return future_response(self.state, then(work, lambda _: reply), model_id)

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
        served = self.state.model_paths
        if source.base_model not in served:
            raise WireError("path", f"the checkpoint's base model {source.base_model!r} is not served here "
                            f"(served: {sorted(served)})")  # fmt: skip
        metadata = metadata_strings(body.get("user_metadata"))
        record = dataclasses.replace(source, model_id=model_id, created=time.time(), user_metadata=metadata)
        reply = {"type": "load_weights", "path": path, "model_id": model_id}
        work = self.state.create_model(
            record, spec_of(source), reply, session_id, checkpoint=(path, optimizer)
        )
        return future_response(self.state, work, model_id)

    # ---- REST ---------------------------------------------------------------------------------------

    async def _weights_info(self, request: web.Request) -> web.Response:
        body = await json_body(request)
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


def _state(model_id: str, training: bool, host: AdapterHost) -> tuple[Any, Any]:
    """On the host: copies of the adapter's weights, and its optimizer state for a training checkpoint."""
    return host.adapter_state(model_id), host.optimizer_state(model_id) if training else None


def _load(
    model_id: str, weights: Mapping[str, Any], optimizer: Mapping[str, Any] | None, host: AdapterHost
) -> None:
    """On the host: a checkpoint into the client's adapter (a misfit is a 400 naming `path`)."""
    try:
        host.load_state(model_id, weights, optimizer)
    except ValueError as err:
        raise WireError("path", str(err)) from err


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
