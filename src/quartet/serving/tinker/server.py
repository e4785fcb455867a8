"""`TinkerServer`: the HTTP service the official `tinker` SDK talks to (docs/notes/tinker_protocol.md).

Served: client config, sessions and heartbeats, telemetry (accepted, dropped), server capabilities
(the configured model names), `create_model` (LoRA), `get_info`, `forward_backward` / `forward` with the
`cross_entropy` loss, `optim_step` with AdamParams, and `retrieve_future`. Any other `/api/v1/` call
answers 404 naming it as not served yet (the SDK's `NotFoundError`), never a 500.

Every request carries the service's API key in `X-API-Key` (401 otherwise, `AuthenticationError`). A
malformed body answers 400 naming the field (`BadRequestError`). Work runs off the event loop: model
creation on a shared thread, each model's calls on a thread of its own, in the order they arrived; the
SDK polls their futures, which answer `try_again` until done, then the result (protobuf for
forward_backward) or `{"error", "category"}` (the SDK's `RequestFailedError`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from quartet.serving.errors import ApiError
from quartet.serving.http_log import http_logger
from quartet.serving.tinker.backend import AdamStep, LoraModel, NotServedError, lora_spec
from quartet.serving.tinker.wire import WireError, decode_forward_backward, encode_forward_backward_output

__all__ = ["TinkerServer"]

logger = logging.getLogger(__name__)
_PROTO = "application/x-protobuf"
_NOT_YET = (
    "asample", "create_sampling_session", "join_sampling_session", "save_weights", "load_weights",
    "save_weights_for_sampler", "save_weights_external", "copy_weights", "create_custom_loss",
    "retrieve_futures", "auth/token", "unload_model", "training_runs",
)  # fmt: skip


@dataclasses.dataclass
class _Model:
    model: LoraModel
    base_model: str
    rank: int
    worker: concurrent.futures.ThreadPoolExecutor


def _fail(status: int, message: str, error_type: str, param: str | None = None) -> ApiError:
    return ApiError(status, message, error_type, param)


class TinkerServer:
    """The Tinker-compatible service over local models.

    Args:
        models: the base model names clients may ask for -> local model folders (nothing is downloaded).
        api_key: the key every request must carry; the SDK requires the `tml-` prefix.
        host, port: where to listen (port 0: any free port).
    """

    def __init__(
        self, models: Mapping[str, str | Path], api_key: str, host: str = "127.0.0.1", port: int = 0
    ):
        if not api_key.startswith("tml-"):
            raise ValueError("the Tinker SDK only sends API keys that start with 'tml-'")
        self.models = {name: Path(path) for name, path in models.items()}
        self.api_key = api_key
        self.host = host
        self.port = port
        self.url: str | None = None
        self._sessions: set[str] = set()
        self._trained: dict[str, _Model] = {}
        self._futures: dict[str, concurrent.futures.Future[Any]] = {}
        self._builder = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tinker-create")
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
            "create_model": self._create_model,
            "get_info": self._get_info,
            "forward_backward": self._forward_backward,
            "forward": self._forward,
            "optim_step": self._optim_step,
            "retrieve_future": self._retrieve_future,
        }
        for name, handler in post.items():
            self.app.router.add_post(f"/api/v1/{name}", handler)
        # The SDK's `ServiceClient.close()` / `with ServiceClient(...)` exit ends its session (h-cook).
        self.app.router.add_post("/api/v1/sessions/{session_id}/finish", self._finish_session)
        self.app.router.add_get("/api/v1/healthz", self._healthz)
        self.app.router.add_get("/api/v1/get_server_capabilities", self._capabilities)
        self.app.router.add_route("*", "/{tail:.*}", self._not_served)

    # ---- life ---------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen and return the base URL (`http://host:port`) to pass as the SDK's `base_url`."""
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0, logger=http_logger())
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        self.url = f"http://{self.host}:{runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        """Stop listening and end the worker threads (queued work is dropped; nothing is saved)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        for entry in self._trained.values():
            entry.worker.shutdown(wait=False, cancel_futures=True)
        self._builder.shutdown(wait=False, cancel_futures=True)

    def start_in_thread(self) -> str:
        """`start` on an event loop of its own in a daemon thread (tests, synchronous callers)."""
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="quartet-tinker", daemon=True)
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.start(), loop).result(60)

    def stop_thread(self) -> None:
        """Undo `start_in_thread`; idempotent."""
        loop, thread = self._loop, self._thread
        self._loop = None
        self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop(), loop).result(60)
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
            return await handler(request)
        except ApiError as err:
            return web.json_response(err.body(), status=err.status)
        except WireError as err:
            return web.json_response(ApiError.bad_request(str(err), err.field).body(), status=400)
        except NotServedError as err:
            return web.json_response(ApiError.bad_request(str(err)).body(), status=400)
        except web.HTTPException:
            raise
        except Exception as err:  # a bug: still a JSON body the SDK can show
            logger.exception("tinker service: %s failed", request.path)
            return web.json_response(
                _fail(500, f"{type(err).__name__}: {err}", "server_error").body(), status=500
            )

    async def _not_served(self, request: web.Request) -> web.Response:
        call = request.path.removeprefix("/api/v1/")
        known = any(call == name or call.startswith(name + "/") for name in _NOT_YET)
        what = "is not served yet by quartet's Tinker service" if known else "is not a Tinker call"
        raise _fail(404, f"{request.method} /api/v1/{call} {what}", "not_found", call)

    # ---- session calls ------------------------------------------------------------------------------

    async def _client_config(self, request: web.Request) -> web.Response:
        # One forward_backward request per call, in order: the model's thread keeps arrival order.
        return web.json_response({"pjwt_auth_enabled": False, "parallel_fwdbwd_chunks": False})

    async def _dynamic_config(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def _create_session(self, request: web.Request) -> web.Response:
        await _json(request)
        session_id = f"session-{uuid.uuid4().hex[:12]}"
        self._sessions.add(session_id)
        return web.json_response({"type": "create_session", "session_id": session_id})

    async def _heartbeat(self, request: web.Request) -> web.Response:
        body = await _json(request)
        if body.get("session_id") not in self._sessions:
            raise _fail(404, f"unknown session_id {body.get('session_id')!r}", "not_found", "session_id")
        return web.json_response({"type": "session_heartbeat"})

    async def _finish_session(self, request: web.Request) -> web.Response:
        """End a session (body `{reason: {type: success|errored|interrupted}, detail}`); its models stay."""
        await _json(request)
        session_id = request.match_info["session_id"]
        if session_id not in self._sessions:
            raise _fail(404, f"unknown session_id {session_id!r}", "not_found", "session_id")
        self._sessions.discard(session_id)
        return web.json_response({})

    async def _telemetry(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"status": "accepted"})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _capabilities(self, request: web.Request) -> web.Response:
        models = [{"model_name": n, "trainable": True, "sampleable": False} for n in self.models]
        return web.json_response({"supported_models": models})

    # ---- models -------------------------------------------------------------------------------------

    async def _create_model(self, request: web.Request) -> web.Response:
        body = await _json(request)
        base = body.get("base_model")
        if base not in self.models:
            raise ApiError.bad_request(
                f"base_model {base!r} is not served (served: {sorted(self.models)})", "base_model"
            )
        lora = body.get("lora_config")
        if not isinstance(lora, dict):
            raise NotServedError("full fine-tuning (no lora_config) is not served yet")
        rank = lora.get("rank")
        if not isinstance(rank, int) or isinstance(rank, bool):
            raise ApiError.bad_request("lora_config.rank must be an integer", "lora_config.rank")
        seed = lora.get("seed") or 0
        spec = lora_spec(
            self.models[base],
            rank,
            int(seed),
            bool(lora.get("train_attn", True)),
            bool(lora.get("train_mlp", True)),
        )
        model_id = f"model-{uuid.uuid4().hex[:12]}"

        def build() -> dict[str, Any]:
            worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"tinker-{model_id}")
            self._trained[model_id] = _Model(LoraModel(spec), base, rank, worker)
            return {"type": "create_model", "model_id": model_id}

        return self._future(self._builder.submit(build), model_id)

    def _model(self, model_id: object) -> _Model:
        entry = self._trained.get(str(model_id))
        if entry is None:
            raise _fail(404, f"unknown model_id {model_id!r}", "not_found", "model_id")
        return entry

    async def _get_info(self, request: web.Request) -> web.Response:
        body = await _json(request)
        entry = self._model(body.get("model_id"))
        data = {
            "model_name": entry.base_model,
            "tokenizer_id": str(self.models[entry.base_model]),
            "arch": None,
        }
        info = {"type": "get_info", "model_id": body["model_id"], "model_data": data, "is_lora": True,
                "lora_rank": entry.rank, "model_name": entry.base_model}  # fmt: skip
        return web.json_response(info)

    async def _forward(self, request: web.Request) -> web.Response:
        return await self._run_forward_backward(request, forward_only=True)

    async def _forward_backward(self, request: web.Request) -> web.Response:
        return await self._run_forward_backward(request, forward_only=False)

    async def _run_forward_backward(self, request: web.Request, forward_only: bool) -> web.Response:
        if request.headers.get("Content-Encoding", "") not in ("", "identity"):
            raise ApiError.bad_request(
                "compressed bodies are not served (client/config says so)", "Content-Encoding"
            )
        if not request.content_type.startswith(_PROTO):
            raise ApiError.bad_request(
                f"forward_backward takes {_PROTO}, not {request.content_type}", "Content-Type"
            )
        decoded = decode_forward_backward(await request.read(), forward_only)
        entry = self._model(decoded.model_id)
        entry.model.check(decoded.loss_fn, decoded.data)  # 400 naming the field before anything is queued

        def run() -> bytes:
            outputs, metrics = entry.model.forward_backward(
                decoded.loss_fn, decoded.data, decoded.forward_only
            )
            return encode_forward_backward_output(outputs, metrics)

        return self._future(entry.worker.submit(run), decoded.model_id)

    async def _optim_step(self, request: web.Request) -> web.Response:
        body = await _json(request)
        entry = self._model(body.get("model_id"))
        if "adam_params" not in body:
            raise NotServedError("optim_step: only adam_params is served yet")
        params = body["adam_params"]
        names = {f.name for f in dataclasses.fields(AdamStep)}
        if not isinstance(params, dict) or set(params) - names:
            raise ApiError.bad_request(f"adam_params takes {sorted(names)}", "adam_params")
        try:
            adam = AdamStep(**{k: float(v) for k, v in params.items()})
        except (TypeError, ValueError) as err:
            raise ApiError.bad_request(f"adam_params: {err}", "adam_params") from err
        step = entry.worker.submit(lambda: {"metrics": entry.model.optim_step(adam)})
        return self._future(step, body["model_id"])

    # ---- futures ------------------------------------------------------------------------------------

    def _future(self, work: concurrent.futures.Future[Any], model_id: str) -> web.Response:
        request_id = f"req-{uuid.uuid4().hex}"
        self._futures[request_id] = work
        return web.json_response({"request_id": request_id, "model_id": model_id})

    async def _retrieve_future(self, request: web.Request) -> web.Response:
        body = await _json(request)
        request_id = str(body.get("request_id"))
        work = self._futures.get(request_id)
        if work is None:
            raise _fail(404, f"unknown request_id {request_id!r}", "not_found", "request_id")
        if not work.done():
            await asyncio.wait([asyncio.wrap_future(work)], timeout=1.0)  # a short long-poll
        if not work.done():
            return web.json_response({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        del self._futures[request_id]
        error = work.exception()
        if isinstance(error, WireError | NotServedError):
            return web.json_response({"error": str(error), "category": "user"})
        if error is not None:
            return web.json_response({"error": f"{type(error).__name__}: {error}", "category": "server"})
        result = work.result()
        if isinstance(result, bytes):
            return web.Response(body=result, content_type=_PROTO)
        return web.json_response(result)


async def _json(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as err:
        raise ApiError.bad_request(f"the body is not JSON: {err}", "body") from err
    if not isinstance(body, dict):
        raise ApiError.bad_request("the body must be a JSON object", "body")
    return body
