"""Sampling sessions and their routes: `create_sampling_session`, `asample` (and `compute_logprobs`, which the
SDK sends as an `asample`), `GET samplers/{id}`; and the sampler adapters they sample from.

A session samples one base model's host, with either no adapter (a `base_model` session) or a SAMPLER
ADAPTER: a frozen copy of a client's LoRA weights loaded next to the training adapters on the same base
(`AdapterHost.add(..., trainable=False)`). Only adapter weights ever move: `save_weights_for_sampler`
copies the client's adapter into a sampler adapter (`snapshot`), and a `model_path` session loads a saved
sampler checkpoint's adapter (`CheckpointStore.resolve`); nothing is merged into the base, nothing of the
base is copied. At most `max_sampler_adapters` per base stay loaded (least recently used leave first); a
session whose adapter left reloads it from its checkpoint, and one that had only an in-memory snapshot
gets a 410 saying to save again.

Every sample runs on its base's thread (`queues.FairQueues`, one queue per session, so clients take
turns), with exactly its adapter, and reaches the client through the futures as protobuf
`SampleResponse`. Requests are checked (`sample_wire`) before anything is queued. Sample requests queued
together on one base (of one client or several, of any adapters) run as one batch
(`FairQueues.submit_batched`, tag = the base; `sampling_batch.sample_many`: one decode forward per token
for all of them), each answering what it would alone.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import hashlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from quartet.serving.errors import ApiError
from quartet.serving.tinker.adapters import AdapterHost, AdapterSpec
from quartet.serving.tinker.http_body import future_response, json_body, then
from quartet.serving.tinker.queues import Batchable
from quartet.serving.tinker.sample_wire import (
    SampleLimits,
    check_against_model,
    decode_sample,
    decode_sampling_session,
    encode_sample_response,
)
from quartet.serving.tinker.sampling_batch import SampleRequest, sample_many
from quartet.serving.tinker.wire import WireError

if TYPE_CHECKING:
    import torch

    from quartet.serving.tinker.ray_hosts import HostHandle
    from quartet.serving.tinker.state import ServiceState

__all__ = ["SamplingRoutes"]

Resolver = Callable[[str], tuple[str, AdapterSpec, Mapping[str, "torch.Tensor"]]]
"""model_path -> (base model, adapter settings, adapter weights): a saved sampler checkpoint."""


@dataclasses.dataclass(frozen=True)
class _Session:
    base_model: str
    adapter: str | None  # None: the bare base model
    model_path: str | None  # where the adapter can be reloaded from (None: an in-memory snapshot)


class SamplingRoutes:
    """The sampling sessions of one service (module doc).

    Args:
        state: the service's hosts and futures.
        limits: the bounds on one request (num_samples, max_tokens, top-k).
        resolve: how a `model_path` becomes adapter weights (the checkpoint store); None: not served.
        max_sampler_adapters: sampler adapters kept loaded per base model.
    """

    def __init__(
        self,
        state: ServiceState,
        limits: SampleLimits,
        resolve: Resolver | None = None,
        max_sampler_adapters: int = 16,
    ) -> None:
        self.state = state
        self.limits = limits
        self.resolve = resolve
        self.max_sampler_adapters = max_sampler_adapters
        self._sessions: dict[str, _Session] = {}
        self._loaded: dict[str, collections.OrderedDict[str, None]] = {}  # base -> sampler adapters, LRU

    def register(self, app: web.Application) -> None:
        app.router.add_post("/api/v1/create_sampling_session", self.create_sampling_session)
        app.router.add_post("/api/v1/asample", self.asample)
        app.router.add_get("/api/v1/samplers/{sampler_id}", self.get_sampler)

    # ---- sampler adapters ---------------------------------------------------------------------------

    def snapshot(self, model_id: str) -> concurrent.futures.Future[dict[str, Any]]:
        """A session on a frozen copy of training client `model_id`'s adapter as it is once every call the
        client sent before has run: the SDK's `save_weights_and_get_sampling_client` (its future's result is
        `save_weights_for_sampler`'s answer, with the `sampling_session_id`)."""
        entry = self.state.model(model_id)
        name = f"sampler-{uuid.uuid4().hex[:12]}"
        work = self.state.run_on_model(model_id, functools.partial(_copy_adapter, model_id, name, entry.spec))

        def opened(_: object) -> dict[str, Any]:
            self._loaded_on(entry.base_model, name)
            session_id = self._open(_Session(entry.base_model, name, None))
            return {"type": "save_weights_for_sampler", "sampling_session_id": session_id}

        return then(work, opened)

    async def _load_path(self, model_path: str) -> tuple[str, str]:
        """(base model, sampler adapter) of the saved sampler checkpoint `model_path`, loaded once."""
        if self.resolve is None:
            raise ApiError(
                404, "sampling from a model_path needs the checkpoint store", "not_found", "model_path"
            )
        base, spec, weights = self.resolve(model_path)
        name = "sampler-" + hashlib.sha256(model_path.encode()).hexdigest()[:12]
        if name in self._loaded.get(base, {}):
            self._loaded[base].move_to_end(name)
            return base, name
        entry = await asyncio.wrap_future(self.state.builder.submit(self.state.host_for, base))
        load = functools.partial(_load_adapter, name, spec, dict(weights))
        await asyncio.wrap_future(entry.queues.submit(name, lambda: entry.host.call(load)))
        self._loaded_on(base, name)
        return base, name

    def _loaded_on(self, base: str, name: str) -> None:
        """Record `name` as loaded on `base`; unload the least recently used beyond the bound."""
        loaded = self._loaded.setdefault(base, collections.OrderedDict())
        loaded[name] = None
        entry = self.state.hosts[base]
        while len(loaded) > self.max_sampler_adapters:
            old, _ = loaded.popitem(last=False)
            remove = functools.partial(AdapterHost.remove, name=old)
            entry.queues.submit(old, functools.partial(entry.host.call, remove))

    def _open(self, session: _Session) -> str:
        session_id = f"sampler-session-{uuid.uuid4().hex[:12]}"
        self._sessions[session_id] = session
        return session_id

    # ---- routes -------------------------------------------------------------------------------------

    async def create_sampling_session(self, request: web.Request) -> web.Response:
        """{session_id, sampling_session_seq_id, base_model?, model_path?} -> {sampling_session_id}."""
        target = decode_sampling_session(await json_body(request))
        if target.model_path is not None:
            base, adapter = await self._load_path(target.model_path)
            session = _Session(base, adapter, target.model_path)
        else:
            base = self._base_name(target.base_model)
            await asyncio.wrap_future(self.state.builder.submit(self.state.host_for, base))
            session = _Session(base, None, None)
        session_id = self._open(session)
        return web.json_response({"type": "create_sampling_session", "sampling_session_id": session_id})

    def _base_name(self, name: str | None) -> str:
        if name not in self.state.model_paths:
            raise ApiError.bad_request(
                f"base_model {name!r} is not served (served: {sorted(self.state.model_paths)})", "base_model"
            )
        return str(name)

    async def get_sampler(self, request: web.Request) -> web.Response:
        """GET samplers/{id} -> {sampler_id, base_model, model_path}."""
        sampler_id = request.match_info["sampler_id"]
        session = self._session(sampler_id)
        body = {"sampler_id": sampler_id, "base_model": session.base_model, "model_path": session.model_path}
        return web.json_response(body)

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise ApiError(
                404, f"unknown sampling_session_id {session_id!r}", "not_found", "sampling_session_id"
            )
        return session

    async def asample(self, request: web.Request) -> web.Response:
        """A sample request -> an untyped future with one sequence id per sample; the result is protobuf."""
        call = decode_sample(await json_body(request), self.limits)
        if call.sampling_session_id is not None:
            key, session = call.sampling_session_id, self._session(call.sampling_session_id)
        elif call.target.model_path is not None:
            base, adapter = await self._load_path(call.target.model_path)
            key, session = call.target.model_path, _Session(base, adapter, call.target.model_path)
        else:  # the request names its base model itself (the SDK always sends a session)
            base = self._base_name(call.target.base_model)
            await asyncio.wrap_future(self.state.builder.submit(self.state.host_for, base))
            key, session = base, _Session(base, None, None)
        await self._ensure_loaded(session)
        entry = self.state.hosts[session.base_model]
        host = entry.host
        max_tokens = check_against_model(call, host.vocab_size, host.context, self.limits)
        params = call.params(max_tokens, host.eos_ids)
        # ---- batched sampling (issue 51 item 3): this request may run with others queued on its base
        job = SampleRequest(
            session.adapter,
            tuple(call.prompt),
            params,
            call.num_samples,
            call.prompt_logprobs,
            call.topk_prompt_logprobs,
            call.topk_sample_logprobs,
            call.prompt_logprobs_last_n,
        )
        tag = ("sample", session.base_model, id(host))  # a replaced (dead) host's calls never mix in
        batch = Batchable(tag, job, functools.partial(_sample_batch, host), rows=call.num_samples)
        work = entry.queues.submit_batched(key, batch)
        ids = [f"seq-{uuid.uuid4().hex[:16]}" for _ in range(call.num_samples)]
        return future_response(self.state, work, key, {"sample_sequence_ids": ids})

    async def _ensure_loaded(self, session: _Session) -> None:
        """Reload an evicted sampler adapter from its checkpoint; 410 if it was only a snapshot."""
        if session.adapter is None or session.adapter in self._loaded.get(session.base_model, {}):
            if session.adapter is not None:
                self._loaded[session.base_model].move_to_end(session.adapter)
            return
        if session.model_path is None:
            raise ApiError(
                410,
                f"this sampling client's weights were unloaded (more than {self.max_sampler_adapters} "
                "sampler adapters on its base model; max_sampler_adapters): call "
                "save_weights_and_get_sampling_client again, or save with a name to keep them",
                "gone",
                "sampling_session_id",
            )
        await self._load_path(session.model_path)


def _copy_adapter(model_id: str, name: str, spec: AdapterSpec, host: AdapterHost) -> None:
    """On the host: a frozen sampler adapter `name` holding training adapter `model_id`'s weights."""
    host.add(name, spec, trainable=False)
    host.load_adapter_state(name, host.adapter_state(model_id))


def _load_adapter(name: str, spec: AdapterSpec, weights: dict[str, Any], host: AdapterHost) -> None:
    """On the host: a frozen sampler adapter `name` holding `weights` (a saved checkpoint's)."""
    if name in host.names:
        return
    host.add(name, spec, trainable=False)
    try:
        host.load_adapter_state(name, weights)
    except ValueError as err:
        host.remove(name)
        raise WireError("model_path", f"the checkpoint does not fit its base model: {err}") from err


def _sample_batch(host: HostHandle, jobs: Sequence[SampleRequest]) -> list[bytes | Exception]:
    """The queue's `run_many` for sample requests: all of `jobs` in one `sample_many` where the host is."""
    return host.call(functools.partial(_sample_many_on_host, list(jobs)))


def _sample_many_on_host(jobs: list[SampleRequest], host: AdapterHost) -> list[bytes | Exception]:
    """On the host: each job's protobuf SampleResponse (or its own exception), decoded together."""
    return [
        result if isinstance(result, Exception) else encode_sample_response(result)
        for result in sample_many(host, jobs)
    ]
