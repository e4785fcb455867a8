"""`TinkerServer`: the HTTP service the official `tinker` SDK talks to (docs/notes/tinker_protocol.md).

This module holds the service's life (start, graceful stop), the middleware (API key, typed errors, the
shutdown gate), the session calls and `retrieve_future`; the model calls live in route modules over one
`ServiceState` (`training_routes`). Any other `/api/v1/` call answers 404 naming it as not served, never
a 500.

Every request carries the service's API key in `X-API-Key` (401 otherwise, `AuthenticationError`). A
malformed body answers 400 naming the field (`BadRequestError`); a client whose queue is full gets 429
with Retry-After (the SDK retries it); after shutdown began, 503. The SDK polls futures, which answer
`try_again` until done, then the result (protobuf for forward_backward) or `{"error", "category"}` (the
SDK's `RequestFailedError`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from quartet.serving.errors import ApiError
from quartet.serving.http_log import http_logger
from quartet.serving.tinker.adapters import AdapterSpec
from quartet.serving.tinker.backend import NotServedError
from quartet.serving.tinker.checkpoint_routes import CheckpointRoutes, spec_of
from quartet.serving.tinker.checkpoints import MissingError, parse_path
from quartet.serving.tinker.http_body import json_body
from quartet.serving.tinker.queues import QueueFull
from quartet.serving.tinker.ray_hosts import HostError
from quartet.serving.tinker.sample_wire import SampleLimits
from quartet.serving.tinker.samplers import SamplingRoutes
from quartet.serving.tinker.service_config import TinkerServiceConfig
from quartet.serving.tinker.state import ServiceState
from quartet.serving.tinker.training_routes import TrainingRoutes
from quartet.serving.tinker.wire import WireError

__all__ = ["TinkerServer"]

logger = logging.getLogger(__name__)
_PROTO = "application/x-protobuf"
_NOT_YET = (
    "join_sampling_session", "save_weights_external", "copy_weights", "retrieve_futures", "auth/token",
)  # fmt: skip


_WHILE_CLOSING = ("/retrieve_future", "/session_heartbeat", "/telemetry", "/healthz")
"""What a stopping service still answers: running calls' results can be fetched during the grace."""


def _fail(status: int, message: str, error_type: str, param: str | None = None) -> ApiError:
    return ApiError(status, message, error_type, param)


class TinkerServer:
    """The Tinker-compatible service over local models.

    Args:
        models: the base model names clients may ask for -> local model folders (nothing is downloaded).
        api_key: the key every request must carry; the SDK requires the `tml-` prefix.
        host, port: where to listen (port 0: any free port).
        config: the limits and the state folder (`TinkerServiceConfig`); its `models`, `host` and
            `port` are replaced by the arguments above.
    """

    def __init__(
        self,
        models: Mapping[str, str | Path],
        api_key: str,
        host: str = "127.0.0.1",
        port: int = 0,
        config: TinkerServiceConfig | None = None,
        state_dir: str | Path | None = None,
    ) -> None:
        if not api_key.startswith("tml-"):
            raise ValueError("the Tinker SDK only sends API keys that start with 'tml-'")
        folders = {n: str(p) for n, p in models.items()}
        self._own_state: str | None = None
        if state_dir is None and config is None:  # a temporary state folder, removed by `stop`
            state_dir = self._own_state = tempfile.mkdtemp(prefix="quartet-tinker-")
        base = config or TinkerServiceConfig(models=folders)
        self.config = dataclasses.replace(
            base,
            models=folders,
            host=host,
            port=port,
            state_dir=str(state_dir) if state_dir is not None else base.state_dir,
        )
        self.api_key = api_key
        self.state = ServiceState(self.config)
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.app = web.Application(middlewares=[self._errors], client_max_size=64 * 2**20)
        post: dict[str, Callable[[web.Request], Any]] = {
            "client/config": self._client_config,
            "client/dynamic_config": self._dynamic_config,
            "create_session": self._create_session,
            "session_heartbeat": self._heartbeat,
            "telemetry": self._telemetry,
            "retrieve_future": self._retrieve_future,
            "create_custom_loss": self._create_custom_loss,
        }
        for name, handler in post.items():
            self.app.router.add_post(f"/api/v1/{name}", handler)
        # The SDK's `ServiceClient.close()` / `with ServiceClient(...)` exit ends its session (h-cook).
        self.app.router.add_post("/api/v1/sessions/{session_id}/finish", self._finish_session)
        self.app.router.add_get("/api/v1/healthz", self._healthz)
        self.app.router.add_get("/api/v1/get_server_capabilities", self._capabilities)
        TrainingRoutes(self.state).register(self.app)
        limits = SampleLimits(
            max_num_samples=self.config.max_num_samples, max_tokens=self.config.max_sample_tokens
        )
        self.sampling = SamplingRoutes(
            self.state, limits, resolve=self._resolve, max_sampler_adapters=self.config.max_sampler_adapters
        )
        self.sampling.register(self.app)
        CheckpointRoutes(self.state, self.sampling).add_to(self.app.router)
        self.app.router.add_route("*", "/{tail:.*}", self._not_served)

    def _resolve(self, model_path: str) -> tuple[str, AdapterSpec, Mapping[str, Any]]:
        """A saved checkpoint's base model, adapter settings and weights (for a sampling session)."""
        base, _, weights = self.state.store.resolve(model_path)
        record = self.state.store.run(parse_path(model_path, "model_path").model_id, "model_path")
        return base, spec_of(record), weights

    @classmethod
    def from_config(cls, config: TinkerServiceConfig) -> TinkerServer:
        """The service `config` describes (the key from its `api_key_env`)."""
        return cls(config.models, config.api_key(), config.host, config.port, config=config)

    # ---- life ---------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen and return the base URL (`http://host:port`) to pass as the SDK's `base_url`."""
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0, logger=http_logger())
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        self._runner = runner
        self.url = f"http://{self.config.host}:{runner.addresses[0][1]}"
        return self.url

    async def stop(self, grace_s: float | None = None) -> None:
        """Graceful stop: new calls get 503, queued ones are cancelled, running ones get `grace_s`
        (default `shutdown_grace_s`) to finish; then stop listening. Nothing is saved that was not asked."""
        grace = self.config.shutdown_grace_s if grace_s is None else grace_s
        await asyncio.get_running_loop().run_in_executor(None, self.state.shutdown, grace)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        if self._own_state is not None:
            shutil.rmtree(self._own_state, ignore_errors=True)

    def start_in_thread(self) -> str:
        """`start` on an event loop of its own in a daemon thread (tests, synchronous callers)."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="quartet-tinker", daemon=True)
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.start(), loop).result(60)

    def stop_thread(self, grace_s: float | None = None) -> None:
        """Undo `start_in_thread`; idempotent."""
        loop, thread = self._loop, self._thread
        self._loop = None
        self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(grace_s), loop).result(120)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(60)
        loop.close()

    # ---- middleware ---------------------------------------------------------------------------------

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The key check, then every failure as a JSON error body with the status the SDK maps."""
        try:
            if request.path != "/api/v1/healthz" and request.headers.get("X-API-Key") != self.api_key:
                raise _fail(401, "missing or wrong API key (header X-API-Key)", "authentication_error")
            if self.state.closing and not request.path.endswith(_WHILE_CLOSING):
                raise _fail(503, "the service is shutting down", "service_unavailable")
            self.state.expire_sessions()
            return await handler(request)
        except ApiError as err:
            return web.json_response(err.body(), status=err.status)
        except MissingError as err:  # a checkpoint or run that does not exist
            return web.json_response(_fail(404, str(err), "not_found", err.field).body(), status=404)
        except WireError as err:
            return web.json_response(ApiError.bad_request(str(err), err.field).body(), status=400)
        except NotServedError as err:
            return web.json_response(ApiError.bad_request(str(err)).body(), status=400)
        except QueueFull as err:
            body = _fail(429, str(err), "rate_limit_error", "model_id").body()
            headers = {"Retry-After": str(max(1, round(err.retry_after_s)))}
            return web.json_response(body, status=429, headers=headers)
        except web.HTTPException:
            raise
        except Exception as err:  # a bug: still a JSON body the SDK can show
            logger.exception("tinker service: %s failed", request.path)
            return web.json_response(
                _fail(500, f"{type(err).__name__}: {err}", "server_error").body(), status=500
            )

    async def _create_custom_loss(self, request: web.Request) -> web.Response:
        raise _fail(
            404,
            "create_custom_loss is never served: model-written code does not run in quartet's Tinker "
            "service; client/config says custom_loss_server_side: false, so the SDK runs custom losses "
            "client-side (forward_backward_custom)",
            "not_found",
            "create_custom_loss",
        )

    async def _not_served(self, request: web.Request) -> web.Response:
        call = request.path.removeprefix("/api/v1/")
        known = any(call == name or call.startswith(name + "/") for name in _NOT_YET)
        what = "is not served yet by quartet's Tinker service" if known else "is not a Tinker call"
        raise _fail(404, f"{request.method} /api/v1/{call} {what}", "not_found", call)

    # ---- session calls ------------------------------------------------------------------------------

    async def _client_config(self, request: web.Request) -> web.Response:
        # One forward_backward request per call, in order: the model's queue keeps arrival order.
        # Custom losses run in the client (create_custom_loss keeps its LossHandle client-side).
        return web.json_response(
            {"pjwt_auth_enabled": False, "parallel_fwdbwd_chunks": False, "custom_loss_server_side": False}
        )

    async def _dynamic_config(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _create_session(self, request: web.Request) -> web.Response:
        await json_body(request)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        self.state.sessions[session_id] = time.monotonic()
        return web.json_response({"type": "create_session", "session_id": session_id})

    async def _heartbeat(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        self.state.heartbeat(body.get("session_id"))
        return web.json_response({"type": "session_heartbeat"})

    async def _finish_session(self, request: web.Request) -> web.Response:
        """End a session (body `{reason: {type: success|errored|interrupted}, detail}`); its models stay."""
        await json_body(request)
        session_id = request.match_info["session_id"]
        if self.state.sessions.pop(session_id, None) is None:
            raise _fail(404, f"unknown session_id {session_id!r}", "not_found", "session_id")
        return web.json_response({})

    async def _telemetry(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "accepted"})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _capabilities(self, request: web.Request) -> web.Response:
        models = [{"model_name": n, "trainable": True, "sampleable": True} for n in self.state.model_paths]
        return web.json_response({"supported_models": models})

    # ---- futures ------------------------------------------------------------------------------------

    async def _retrieve_future(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        request_id = str(body.get("request_id"))
        work = self.state.pending(request_id)
        if not work.done():
            await asyncio.wait([asyncio.wrap_future(work)], timeout=1.0)  # a short long-poll
        if not work.done():
            return web.json_response({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        self.state.forget(request_id)
        return _result(work)


def _result(work: concurrent.futures.Future[Any]) -> web.Response:
    """A finished future as the SDK reads it: the result, or `{"error", "category"}`."""
    if work.cancelled():
        return web.json_response({"error": "cancelled: the service is shutting down", "category": "server"})
    error = work.exception()
    if isinstance(error, WireError | NotServedError | ApiError):
        return web.json_response({"error": str(error), "category": "user"})
    if isinstance(error, HostError):
        return web.json_response({"error": str(error), "category": "server"})
    if error is not None:
        return web.json_response({"error": f"{type(error).__name__}: {error}", "category": "server"})
    result = work.result()
    if isinstance(result, bytes):
        return web.Response(body=result, content_type=_PROTO)
    return web.json_response(result)
