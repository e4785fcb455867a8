"""Sampling sessions and their routes: `create_sampling_session`, `asample` (and `compute_logprobs`, which the
SDK sends as an `asample`), `GET samplers/{id}`.

A session names a `Sampler`: a module, the one thread its calls run on, and what requests are checked
against (vocabulary, context, EOS ids, a tokenizer's decode for stop strings). A `base_model` session
samples that configured base model, loaded once per name, frozen, on a thread of its own. Another part of
the service (e.g. `save_weights_for_sampler`) opens a session on any other `Sampler` with `open_session`:
a live training model's peft module and that model's own worker, so sampling never races its training.
`model_path` sessions answer 404 "not served yet" until such a part exists.

Routes answer like the rest of the service (`TinkerServer`): a malformed body 400 naming the field
(`WireError`) before anything is queued; the sampling itself runs on the sampler's thread and reaches the
client through the server's futures as protobuf `SampleResponse`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from aiohttp import web
from torch import nn

from quartet.config.model import Dtype
from quartet.engines.model_init import build_model
from quartet.engines.spec import EngineSpec
from quartet.serving.errors import ApiError
from quartet.serving.tinker.sample_wire import (
    SampleLimits,
    SessionTarget,
    check_against_model,
    decode_sample,
    decode_sampling_session,
    encode_sample_response,
)
from quartet.serving.tinker.sampling import context_length, eos_token_ids, sample, vocab_size
from quartet.serving.tinker.wire import WireError

__all__ = ["Sampler", "SamplingSessions", "SubmitFuture", "load_base_sampler"]

SubmitFuture = Callable[[concurrent.futures.Future[Any], str, Mapping[str, Any]], web.Response]
"""The server's future registry: (work, model_id, extra fields of the answer) -> the untyped-future answer."""


@dataclasses.dataclass(frozen=True)
class Sampler:
    """A module to sample from and the single thread its calls (training or sampling) run on.

    `activate` is entered, on `worker`, around each sample call: e.g. a peft model's `disable_adapter`
    (sample its base) or a context that selects one adapter of many (a multi-adapter host).
    """

    module: nn.Module
    worker: concurrent.futures.Executor
    vocab: int
    context: int | None
    eos_ids: frozenset[int]
    decode: Callable[[Sequence[int]], str] | None
    activate: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext

    @classmethod
    def of(
        cls,
        module: nn.Module,
        worker: concurrent.futures.Executor,
        tokenizer_dir: str | Path,
        activate: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> Sampler:
        """A sampler over `module` whose stop strings decode with the tokenizer saved in `tokenizer_dir`."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)

        def decode(ids: Sequence[int]) -> str:
            return str(tokenizer.decode(list(ids), skip_special_tokens=True))

        eos = eos_token_ids(module)
        return cls(module, worker, vocab_size(module), context_length(module), eos, decode, activate)


def load_base_sampler(folder: Path, worker: concurrent.futures.Executor) -> Sampler:
    """The base model in `folder`, float32, frozen, in eval mode, with its tokenizer (built on the caller's
    thread: `SamplingSessions` calls it on `worker`)."""
    module = build_model(EngineSpec(str(folder), mixed_precision=Dtype.FLOAT32))
    module.eval()
    return Sampler.of(module, worker, folder)


@dataclasses.dataclass(frozen=True)
class _Session:
    target: SessionTarget
    sampler: concurrent.futures.Future[Sampler]


class SamplingSessions:
    """The sampling sessions of one service, their samplers, and the HTTP handlers of the sampling calls.

    Args:
        models: configured base model names -> local folders (as `TinkerServer` has them).
        submit: the server's future registry (`TinkerServer._future`).
        limits: the bounds on one request (num_samples, max_tokens, top-k).
    """

    def __init__(self, models: Mapping[str, Path], submit: SubmitFuture, limits: SampleLimits) -> None:
        self.models = dict(models)
        self.limits = limits
        self._submit = submit
        self._sessions: dict[str, _Session] = {}
        self._bases: dict[str, concurrent.futures.Future[Sampler]] = {}
        self._workers: list[concurrent.futures.ThreadPoolExecutor] = []
        self._lock = threading.Lock()

    def post_routes(self) -> dict[str, Callable[[web.Request], Any]]:
        """POST /api/v1/<name> -> handler."""
        return {"create_sampling_session": self.create_sampling_session, "asample": self.asample}

    def get_routes(self) -> dict[str, Callable[[web.Request], Any]]:
        """GET /api/v1/<path> -> handler."""
        return {"samplers/{sampler_id}": self.get_sampler}

    def shutdown(self) -> None:
        """End the base models' threads (queued samples are dropped)."""
        for worker in self._workers:
            worker.shutdown(wait=False, cancel_futures=True)

    def open_session(self, sampler: Sampler, base_model: str, model_path: str | None = None) -> str:
        """A new session on `sampler` (e.g. a live training model's module and worker); its id."""
        ready: concurrent.futures.Future[Sampler] = concurrent.futures.Future()
        ready.set_result(sampler)
        return self._add(_Session(SessionTarget(base_model, model_path), ready))

    def _add(self, session: _Session) -> str:
        session_id = f"sampler-{uuid.uuid4().hex[:12]}"
        self._sessions[session_id] = session
        return session_id

    def _base(self, name: str | None) -> concurrent.futures.Future[Sampler]:
        """The base model `name`'s sampler, loaded once on a thread of its own."""
        if name not in self.models:
            raise ApiError.bad_request(
                f"base_model {name!r} is not served (served: {sorted(self.models)})", "base_model"
            )
        with self._lock:
            failed = name in self._bases and self._bases[name].done() and self._bases[name].exception()
            if name not in self._bases or failed:  # a load that failed is tried again, not cached
                worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"tinker-sample-{name}")
                self._workers.append(worker)
                self._bases[name] = worker.submit(load_base_sampler, self.models[name], worker)
            return self._bases[name]

    @staticmethod
    def _not_yet(target: SessionTarget) -> None:
        if target.model_path is not None:
            raise ApiError(
                404,
                f"sampling from model_path {target.model_path!r} is not served yet (base_model sessions are)",
                "not_found",
                "model_path",
            )

    async def create_sampling_session(self, request: web.Request) -> web.Response:
        """{session_id, sampling_session_seq_id, base_model?, model_path?} -> {sampling_session_id}."""
        target = decode_sampling_session(await _json(request))
        self._not_yet(target)
        ready = self._base(target.base_model)
        await asyncio.wrap_future(ready)  # loads the model once, off the event loop
        session_id = self._add(_Session(target, ready))
        return web.json_response({"type": "create_sampling_session", "sampling_session_id": session_id})

    async def get_sampler(self, request: web.Request) -> web.Response:
        """GET samplers/{id} -> {sampler_id, base_model, model_path}."""
        sampler_id = request.match_info["sampler_id"]
        session = self._session(sampler_id)
        body = {"sampler_id": sampler_id, "base_model": session.target.base_model,
                "model_path": session.target.model_path}  # fmt: skip
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
        call = decode_sample(await _json(request), self.limits)
        if call.sampling_session_id is not None:
            session_id = call.sampling_session_id
            ready = self._session(session_id).sampler
        else:  # the request names its model itself (the SDK always sends a session)
            self._not_yet(call.target)
            session_id, ready = str(call.target.base_model), self._base(call.target.base_model)
        sampler = await asyncio.wrap_future(ready)
        max_tokens = check_against_model(call, sampler.vocab, sampler.context, self.limits)
        params = call.params(max_tokens, sampler.eos_ids)
        if params.stop_strings and sampler.decode is None:
            raise WireError(
                "sampling_params.stop", "stop strings need the model's tokenizer, which is absent"
            )

        def run() -> bytes:
            with sampler.activate():
                result = sample(
                    sampler.module,
                    call.prompt,
                    params,
                    call.num_samples,
                    decode=sampler.decode,
                    prompt_logprobs=call.prompt_logprobs,
                    topk_prompt_logprobs=call.topk_prompt_logprobs,
                    topk_sample_logprobs=call.topk_sample_logprobs,
                    prompt_logprobs_last_n=call.prompt_logprobs_last_n,
                )
            return encode_sample_response(result)

        ids = [f"seq-{uuid.uuid4().hex[:16]}" for _ in range(call.num_samples)]
        return self._submit(sampler.worker.submit(run), session_id, {"sample_sequence_ids": ids})


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as err:
        raise ApiError.bad_request(f"the body is not JSON: {err}", "body") from err
    if not isinstance(body, dict):
        raise ApiError.bad_request("the body must be a JSON object", "body")
    return body
