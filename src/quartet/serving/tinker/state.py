"""`ServiceState`: what the Tinker service holds between requests, and how a call reaches a model.

- hosts: one `AdapterHost` per base model name, loaded on first use, each with its `FairQueues` thread
  (every call on a base runs on that thread; clients take turns; each client's calls keep their order);
- models: the training clients (model_id -> its base and adapter settings); the adapter is named by the
  model_id on its host;
- futures: accepted requests by request_id until fetched once, or `result_ttl_s` after they finished
  (then 410 "expired", as the SDK expects; a client that died mid-request leaves nothing behind for good).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from quartet.serving.errors import ApiError
from quartet.serving.tinker.adapters import AdapterHost, AdapterSpec
from quartet.serving.tinker.checkpoints import CheckpointStore, RunRecord
from quartet.serving.tinker.queues import FairQueues
from quartet.serving.tinker.ray_hosts import HostHandle, start_host
from quartet.serving.tinker.service_config import TinkerServiceConfig
from quartet.serving.tinker.wire import WireError

__all__ = ["HostEntry", "ModelEntry", "ServiceState"]

T = TypeVar("T")
logger = logging.getLogger(__name__)


@dataclasses.dataclass
class HostEntry:
    """A loaded base model (here or in a Ray actor) and the one thread that runs its calls."""

    host: HostHandle
    queues: FairQueues


@dataclasses.dataclass(frozen=True)
class ModelEntry:
    """A training client: its adapter `model_id` on base `base_model`."""

    model_id: str
    base_model: str
    spec: AdapterSpec
    session_id: str | None = None


@dataclasses.dataclass
class _Pending:
    work: concurrent.futures.Future[Any]
    model_id: str | None
    done_at: float | None = None


def _add_adapter(
    name: str,
    spec: AdapterSpec,
    weights: Mapping[str, Any] | None,
    optimizer: Mapping[str, Any] | None,
    host: AdapterHost,
) -> None:
    """On the host: a new training adapter, filled from a checkpoint if `weights` are given."""
    host.add(name, spec)
    if weights is None:
        return
    try:
        host.load_state(name, weights, optimizer)
    except ValueError as err:
        host.remove(name)
        raise WireError("path", f"the checkpoint does not fit: {err}") from err


def _unload(host: HostHandle, model_id: str) -> None:
    host.call(functools.partial(AdapterHost.remove, name=model_id))


class ServiceState:
    """The service's hosts, models and pending results (module doc)."""

    def __init__(self, config: TinkerServiceConfig) -> None:
        self.config = config
        self.store = CheckpointStore(Path(config.state_dir).expanduser())
        swept = self.store.sweep()  # what a service killed mid-save left
        if swept:
            logger.info(
                "tinker service: removed %d leftovers of interrupted saves in %s", swept, config.state_dir
            )
        self.model_paths: Mapping[str, Path] = {n: Path(p).expanduser() for n, p in config.models.items()}
        self.hosts: dict[str, HostEntry] = {}
        self.models: dict[str, ModelEntry] = {}
        self.sessions: dict[str, float] = {}
        self.closing = False
        self._pending: dict[str, _Pending] = {}
        self._expired: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._ended_sessions: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._last_sweep = 0.0
        self._hosts_lock = threading.Lock()
        self.builder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-create")

    # ---- hosts and models ---------------------------------------------------------------------------

    def host_for(self, base_model: str) -> HostEntry:
        """The host of `base_model`, loading it on first use (slow: call from the builder thread)."""
        with self._hosts_lock:
            entry = self.hosts.get(base_model)
            if entry is not None and entry.host.dead:
                entry.queues.shutdown(timeout_s=0)
                for model_id in [m for m, e in self.models.items() if e.base_model == base_model]:
                    del self.models[model_id]  # their adapters died with the host
                entry = None
            if entry is None:
                host = start_host(base_model, self.model_paths[base_model], self.config)
                queues = FairQueues(f"tinker-{base_model}", self.config.max_queued_per_model)
                entry = self.hosts[base_model] = HostEntry(host, queues)
            return entry

    def model(self, model_id: object) -> ModelEntry:
        """The training client `model_id`; 404 naming the field if there is none."""
        entry = self.models.get(str(model_id))
        if entry is None:
            raise ApiError(404, f"unknown model_id {model_id!r}", "not_found", "model_id")
        return entry

    def run_on_model(self, model_id: str, fn: Callable[[AdapterHost], T]) -> concurrent.futures.Future[T]:
        """Queue `fn(host)` behind `model_id`'s earlier calls on its base's thread (QueueFull when full).

        `fn` runs where the host is (a Ray actor on `backend: ray`): it must close over plain data only."""
        entry = self.hosts[self.model(model_id).base_model]
        return entry.queues.submit(model_id, lambda: entry.host.call(fn))

    def create_model(
        self,
        record: RunRecord,
        spec: AdapterSpec,
        reply: dict[str, Any],
        session_id: str | None = None,
        checkpoint: tuple[str, bool] | None = None,
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """On the builder thread: the base's host (loaded once), the adapter `record.model_id` on it (filled
        from `checkpoint` = (tinker path, with optimizer) if given), the run registered so its checkpoints
        load after a restart. The future's result is `reply`."""
        model_id = record.model_id
        if model_id in self.models:
            raise ApiError.bad_request(f"model {model_id!r} exists", "model_id")

        def build() -> dict[str, Any]:
            if model_id in self.models:  # a second request for the same id, queued behind the first
                raise WireError("model_id", f"model {model_id!r} exists")
            entry = self.host_for(record.base_model)
            weights = optimizer = None
            if checkpoint is not None:
                weights, state, _ = self.store.load(checkpoint[0], optimizer=checkpoint[1])
                optimizer = state if checkpoint[1] else None
            add = functools.partial(_add_adapter, model_id, spec, weights, optimizer)
            entry.queues.submit(model_id, functools.partial(entry.host.call, add)).result()
            self.store.register_run(record)
            self.models[model_id] = ModelEntry(model_id, record.base_model, spec, session_id)
            return reply

        return self.builder.submit(build)

    @staticmethod
    def new_model_id() -> str:
        """A fresh model id (also the adapter's name on its host: no `lora_` in it, as peft asks)."""
        return f"model-{uuid.uuid4().hex[:12]}"

    # ---- sessions -----------------------------------------------------------------------------------

    def heartbeat(self, session_id: object) -> None:
        """Keep `session_id` alive; 410 if it expired (the SDK then stops), 404 if it never was."""
        self.expire_sessions()
        if session_id in self.sessions:
            self.sessions[str(session_id)] = time.monotonic()
            return
        if session_id in self._ended_sessions:
            raise ApiError(410, f"session {session_id} expired (no heartbeat)", "gone", "session_id")
        raise ApiError(404, f"unknown session_id {session_id!r}", "not_found", "session_id")

    def expire_sessions(self) -> list[str]:
        """End sessions silent for `session_ttl_s` and unload their models (a client that died leaves
        nothing behind); the model ids unloaded."""
        now = time.monotonic()
        if now - self._last_sweep < min(5.0, self.config.session_ttl_s / 4):
            return []
        self._last_sweep = now
        ended = {s for s, seen in self.sessions.items() if now - seen > self.config.session_ttl_s}
        unloaded = []
        for session in ended:
            del self.sessions[session]
            self._ended_sessions[session] = None
        for model_id, entry in list(self.models.items()):
            if entry.session_id in ended:
                del self.models[model_id]
                host = self.hosts[entry.base_model]
                host.queues.drop(model_id)
                host.queues.submit(model_id, functools.partial(_unload, host.host, model_id))
                unloaded.append(model_id)
        while len(self._ended_sessions) > 10_000:
            self._ended_sessions.popitem(last=False)
        return unloaded

    # ---- futures ------------------------------------------------------------------------------------

    def accept(self, work: concurrent.futures.Future[Any], model_id: str | None) -> str:
        """Keep `work` under a new request_id until fetched or expired; returns the id."""
        request_id = f"req-{uuid.uuid4().hex}"
        pending = _Pending(work, model_id)
        work.add_done_callback(lambda _: setattr(pending, "done_at", time.monotonic()))
        self._pending[request_id] = pending
        self.expire_results()
        return request_id

    def pending(self, request_id: str) -> concurrent.futures.Future[Any]:
        """The work of `request_id`; 410 if it expired unfetched, 404 if it never was."""
        self.expire_results()
        pending = self._pending.get(request_id)
        if pending is not None:
            return pending.work
        if request_id in self._expired:
            raise ApiError(410, f"request {request_id} finished and expired unfetched", "gone", "request_id")
        raise ApiError(404, f"unknown request_id {request_id!r}", "not_found", "request_id")

    def forget(self, request_id: str) -> None:
        """The result was handed out: drop it."""
        self._pending.pop(request_id, None)

    def expire_results(self) -> int:
        """Drop results finished more than `result_ttl_s` ago; returns how many."""
        limit = time.monotonic() - self.config.result_ttl_s
        old = [rid for rid, p in self._pending.items() if p.done_at is not None and p.done_at < limit]
        for rid in old:
            del self._pending[rid]
            self._expired[rid] = None
        while len(self._expired) > 100_000:
            self._expired.popitem(last=False)
        return len(old)

    @property
    def unfetched(self) -> int:
        """Accepted requests whose results were not fetched yet (running, queued or done)."""
        return len(self._pending)

    # ---- shutdown -----------------------------------------------------------------------------------

    def shutdown(self, grace_s: float) -> None:
        """Refuse new work, cancel what is queued, give running calls `grace_s`; saves nothing."""
        self.closing = True
        self.builder.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + grace_s
        for entry in list(self.hosts.values()):
            entry.queues.shutdown(timeout_s=max(0.0, deadline - time.monotonic()))
            entry.host.close()
