"""An OpenAI-compatible HTTP server over a quartet `RolloutEngine`, for agent frameworks and eval harnesses.

    server = OpenAIServer(engine, tokenizer, "policy", api_key="secret")
    url = await server.start()              # http://127.0.0.1:<port>/v1
    ...                                     # OpenAI(base_url=url, api_key="secret").chat.completions...
    outs = await server.generate_tokens(ids, SamplingParams(...))   # in-process, no HTTP
    await server.stop()

(`ServerThread` runs one from plain threads: Ray actors, tests.)

Endpoints: `GET /v1/models` and `/v1/models/{id}`, `POST /v1/chat/completions`, `POST /v1/completions`,
`POST /v1/responses` (the Responses API's text and function-tool subset, `responses_api`), the token-level
`POST /v1/quartet/generate` (`{"prompt_token_ids", "sampling", "multi_modal"?}` -> `{"outputs": [...]}`,
`multi_modal` a vision-language model's images, `quartet.serving.images`) for agent loops
that must train on the exact ids the model wrote, and `GET /openapi.json` (`openapi`). Bodies are parsed in
`protocol` (and `messages`), checked against the server's limits in `limits`, answered in `responses`
(`tool_calls` for Hermes tool calls, `streaming` for `stream: true`). `response_format` and a forced
`tool_choice` become a grammar the engine decodes under (`constraints`). docs/serving_api.md lists it all.

Design:
- **One path into the engine.** Every request, HTTP or in-process, becomes one `GenerationRequest` awaited
  through `engine.generate_one`, so concurrent requests join the engine's continuous batch.
- **Nothing invalid reaches the engine.** The engine decodes all requests in one batch, so one bad request
  could fail the others. Every request is checked in full first: strict JSON (depth, integer size, text
  encodable), every field (unknown fields refused), token ids against the vocabulary, sampling numbers in
  safe ranges, `n` <= `max_n`, prompt + n x max_tokens <= `max_request_tokens`, body <= `max_body_bytes`.
  Each failure is a 4xx with an OpenAI error naming the field; a 5xx is a bug.
- **The event loop never tokenizes** (nor parses: bodies are decoded and checked in worker threads).
  Chat rendering, encoding and decoding run on the tokenizer's own thread (`text.TokenizerWorker`), each
  call bounded in time; text longer than the limits allow is refused before it is tokenized. Prompts over
  `LARGE_TEXT_CHARS` characters take a second lane (thread) with its own copy of the tokenizer, so large
  prompts queue behind each other, never in front of ordinary ones (`tokenizer_lanes`).
- **Every wait is bounded.** A request the engine has not finished within `request_timeout_s` is aborted
  in the engine (`engine.abort`, which frees its slot at the next step) and answered 504. Engine calls run
  on a private loop (`bridge`), so no caller's cancellation ever reaches the engine's futures.
- **Sleep refuses, it does not queue.** `sleep()` stops admitting requests (503, "the rollout engine is
  asleep (training step in progress)", with `Retry-After`), waits for those in the engine to finish, then
  sleeps the engine; `wake()` undoes it. Refusing was chosen over queueing until wake: a training step can
  outlast any sensible HTTP timeout, held connections would hide the state from callers, a scheduler can
  send the request elsewhere, and the official OpenAI client already retries 503 with back-off.
- **Streaming sends finished responses.** `stream: true` answers server-sent events (chat and completions,
  `stream_options.include_usage`, `data: [DONE]`), but the engine returns a sequence only when it
  finishes, so the chunks are cut from the finished response (`streaming`), not sent token by token.
- **Tool calls** are parsed from the model's Hermes blocks when the request has tools (`tool_calls`);
  the tool-call arguments of the history are decoded before the chat template renders them. `tool_choice`
  "required" or a named function constrains the output to such blocks (`constraints`).
- **Errors are OpenAI-shaped** (`{"error": {"message", "type", "param", "code"}}`): 400 for malformed
  bodies (naming the field), 401 for a wrong or missing bearer token when `api_key` is set, 404 for an
  unknown model or path, 413 for a body over `max_body_bytes`, 503 asleep, 504 timeout, 500 for an engine
  failure. A client that hangs up (mid-body or mid-stream) is no error: one INFO line, no traceback (the
  499 "answer" it gets is never sent).
- The server does not own the engine: `stop()` closes the HTTP side only; the caller shuts the engine down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Mapping, Sequence, Sized
from typing import Any, Protocol, runtime_checkable

from aiohttp import ClientPayloadError, web
from aiohttp.typedefs import Handler

from quartet.rollout.base import EngineStateError, RolloutEngine
from quartet.rollout.types import GenerationOutput, GenerationRequest, InvalidRequestError, SamplingParams
from quartet.serving import constraints, protocol, responses, responses_api
from quartet.serving.address import advertised_host
from quartet.serving.bridge import EngineBridge, wait_in_loop
from quartet.serving.errors import ApiError, GenerationTimeoutError, ServerAsleepError, error_body
from quartet.serving.gate import AdmissionGate
from quartet.serving.http_log import http_logger
from quartet.serving.images import check_multi_modal, vision_spec
from quartet.serving.limits import RequestLimits, check_sampling, check_text_size, check_token_ids
from quartet.serving.openapi import openapi_schema
from quartet.serving.streaming import (
    PIECE_CHARS,
    chat_chunks,
    completion_chunks,
    send_events,
    send_typed_events,
)
from quartet.serving.text import (
    TokenizerLike,
    tag_token_ids,
)
from quartet.serving.tokenizer_lanes import TokenizerLanes
from quartet.serving.tool_calls import HERMES_TAGS

__all__ = ["OpenAIServer", "vocab_size_of"]

log = logging.getLogger(__name__)

_OPENAI_NAMES = {
    "n": "n",
    "max_new_tokens": "max_tokens",
    "prompt": "prompt",
    "stop_token_ids": "stop_token_ids",
}
_TOKEN_NAMES = {k: f"sampling.{k}" for k in ("n", "max_new_tokens", "stop_token_ids")} | {
    "prompt": "prompt_token_ids"
}


def vocab_size_of(engine: RolloutEngine, tokenizer: TokenizerLike) -> int:
    """Ids valid for both: the smaller of the tokenizer's length and the engine model's vocabulary."""
    sizes: list[int] = []
    if isinstance(tokenizer, Sized):
        sizes.append(len(tokenizer))
    config_size = getattr(getattr(getattr(engine, "model", None), "config", None), "vocab_size", None)
    if isinstance(config_size, int):
        sizes.append(config_size)
    if not sizes:
        raise ValueError("cannot tell the vocabulary size of this engine and tokenizer: pass vocab_size")
    return min(sizes)


@runtime_checkable
class _Abortable(Protocol):
    def abort(self, request_id: str) -> None: ...


class OpenAIServer:
    """OpenAI-compatible endpoints and an in-process token call over one rollout engine."""

    def __init__(
        self,
        engine: RolloutEngine,
        tokenizer: TokenizerLike,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_new_tokens_default: int = 256,
        request_timeout_s: float = 600.0,
        *,
        max_n: int = 64,
        max_request_tokens: int = 262144,
        max_body_bytes: int = 8 * 2**20,
        vocab_size: int | None = None,
        tokenize_timeout_s: float = 30.0,
    ) -> None:
        """Serve `engine` as the model `model_name` on `host:port` (port 0: a free one, see `start`).

        api_key: when set, every request must send `Authorization: Bearer <api_key>`.
        max_new_tokens_default: response limit when a request sets no `max_tokens` / `max_new_tokens`.
        request_timeout_s: longest wait for the engine per request (and for draining it in `sleep`).
        max_n, max_request_tokens, max_body_bytes: the request limits (`ServerConfig`, `limits`).
        vocab_size: token ids must lie below it (default: `vocab_size_of(engine, tokenizer)`).
        tokenize_timeout_s: longest tokenizer call (rendering, encoding, decoding) per request.
        """
        if max_new_tokens_default < 1:
            raise ValueError(f"max_new_tokens_default must be >= 1, got {max_new_tokens_default}")
        if request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.host = host
        self.port = port
        self.api_key = api_key
        self.max_new_tokens_default = max_new_tokens_default
        self.request_timeout_s = request_timeout_s
        self.limits = RequestLimits(
            vocab_size if vocab_size is not None else vocab_size_of(engine, tokenizer),
            max_n,
            max_request_tokens,
            max_body_bytes,
        )
        self._lanes = TokenizerLanes(tokenizer, tokenize_timeout_s)
        self._tool_tags = tag_token_ids(tokenizer, HERMES_TAGS)
        self._gate = AdmissionGate()
        self._bridge = EngineBridge(engine)
        self._vision = vision_spec(engine)
        self._engine_slept = False
        self._created = int(time.time())
        self._runner: web.AppRunner | None = None
        self.url: str | None = None
        """Base URL (`http://host:port/v1`) once started."""
        self.app = self._application(max_body_bytes)

    def _application(self, max_body_bytes: int) -> web.Application:
        """The aiohttp app: this server's routes behind its middleware (auth, limits, errors)."""
        app = web.Application(middlewares=[self._middleware], client_max_size=max_body_bytes)
        app.router.add_get("/openapi.json", self._openapi)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model_id:.+}", self._model)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/quartet/generate", self._generate)
        return app

    # ---- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> str:
        """Listen on `host:port` and return the base URL `http://host:port/v1` (the port actually bound)."""
        if self._runner is not None:
            raise RuntimeError(f"the server is already running at {self.url}")
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0, logger=http_logger())
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        port = runner.addresses[0][1]
        reachable = advertised_host(self.host)
        host = f"[{reachable}]" if ":" in reachable else reachable
        self.url = f"http://{host}:{port}/v1"
        log.info("OpenAI-compatible server for '%s' at %s", self.model_name, self.url)
        return self.url

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Stop listening; wait up to `drain_timeout_s` for requests in the engine. The engine keeps running.

        In-process `generate_tokens` calls still work afterwards.
        """
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        with contextlib.suppress(TimeoutError):
            await self._gate.wait_idle(drain_timeout_s)
        await asyncio.to_thread(self._bridge.close)
        self._lanes.close()

    @property
    def asleep(self) -> bool:
        """True between `sleep` and `wake`: requests are refused with 503."""
        return not self._gate.is_open

    @property
    def in_flight(self) -> int:
        """Requests of this server in the engine now (timed-out ones until the engine has aborted them)."""
        return self._gate.inside

    async def sleep(self, *, offload_weights: bool = False, sleep_engine: bool = True) -> None:
        """Refuse new requests, wait for those in the engine to finish, then sleep the engine.

        sleep_engine=False only closes the door (for callers that sleep the engine themselves).
        Raises TimeoutError (and reopens) when the engine does not drain within `request_timeout_s`.
        """
        self._gate.set_open(False)
        try:
            await self._gate.wait_idle(self.request_timeout_s)
            if sleep_engine:
                await asyncio.to_thread(self.engine.sleep, offload_weights)
                self._engine_slept = True
        except BaseException:
            self._gate.set_open(True)
            raise

    async def wake(self) -> None:
        """Wake the engine (when `sleep` slept it) and admit requests again."""
        if self._engine_slept:
            await asyncio.to_thread(self.engine.wake)
            self._engine_slept = False
        self._gate.set_open(True)

    # ---- the one path into the engine ---------------------------------------------------------------------

    async def generate_tokens(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        multi_modal: Mapping[str, Any] | None = None,
        prompt_logprobs: int | None = None,
    ) -> list[GenerationOutput]:
        """The `sampling.n` responses to a prompt of token ids, through the engine's shared batch.

        For agent loops in this process (no HTTP). `multi_modal`: the prompt's images for a vision-language
        model (`quartet.serving.images`). `prompt_logprobs`: score the prompt too, with this many
        alternatives per token (`GenerationRequest.prompt_logprobs`). Raises `ServerAsleepError` while asleep,
        `GenerationTimeoutError` after `request_timeout_s` (the request is aborted in the engine), ValueError
        for a token id outside the vocabulary or images that do not fit the prompt (checked here, so they
        never fail the engine's batch), and the engine's own errors (ValueError for a request it cannot
        take, `EngineStateError`).
        """
        try:
            check_token_ids(list(prompt_ids), self.limits, "prompt_token_ids")
            check_token_ids(sampling.stop_token_ids, self.limits, "stop_token_ids")
        except ApiError as exc:
            raise ValueError(exc.message) from None
        images = None
        if multi_modal is not None:
            images = await asyncio.to_thread(check_multi_modal, prompt_ids, multi_modal, self._vision)
        request = GenerationRequest(
            tuple(prompt_ids), sampling, multi_modal=images, prompt_logprobs=prompt_logprobs
        )
        self._gate.enter()
        try:
            call = self._bridge.submit(request)
        except BaseException:
            self._gate.leave()
            raise
        call.add_done_callback(lambda _: self._gate.leave())  # left the engine: finished, failed or aborted
        try:
            return await asyncio.wait_for(wait_in_loop(call), self.request_timeout_s)
        except TimeoutError:
            self._abort(request.request_id)
            raise GenerationTimeoutError(self.request_timeout_s) from None
        except asyncio.CancelledError:  # the caller gave up (its own timeout): free the engine's slot
            self._abort(request.request_id)
            raise

    def _abort(self, request_id: str) -> None:
        if isinstance(self.engine, _Abortable):
            self.engine.abort(request_id)

    async def _engine_call(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        multi_modal: Mapping[str, Any] | None = None,
        prompt_logprobs: int | None = None,
        prompt_param: str = "prompt_token_ids",
    ) -> list[GenerationOutput]:
        """`generate_tokens` with the engine's errors turned into HTTP answers (the engine's field named as
        the body spells it: the prompt's as `prompt_param`)."""
        try:
            return await self.generate_tokens(prompt_ids, sampling, multi_modal, prompt_logprobs)
        except InvalidRequestError as exc:
            param = prompt_param if exc.field == "prompt_token_ids" else exc.field
            raise ApiError.bad_request(str(exc), param) from None
        except ValueError as exc:
            raise ApiError.bad_request(str(exc)) from None
        except EngineStateError as exc:
            raise ApiError(503, str(exc), "service_unavailable", code="engine_unavailable") from None

    # ---- HTTP ---------------------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            self._authorize(request)
            return await handler(request)
        except ApiError as exc:
            headers = {"Retry-After": "1"} if isinstance(exc, ServerAsleepError) else None
            return web.json_response(exc.body(), status=exc.status, headers=headers)
        except web.HTTPRequestEntityTooLarge:
            message = (
                f"the request body is larger than this server's max_body_bytes ({self.limits.max_body_bytes})"
            )
            return web.json_response(error_body(message, "invalid_request_error"), status=413)
        except web.HTTPException as exc:  # the router's 404 / 405
            return web.json_response(error_body(exc.reason, "invalid_request_error"), status=exc.status)
        except (ConnectionResetError, ClientPayloadError) as exc:  # the client hung up: nobody to answer
            log.info("client hung up during %s %s (%s)", request.method, request.path, exc)
            return web.Response(status=499, reason="Client Closed Request")
        except Exception as exc:
            log.exception("request %s %s failed", request.method, request.path)
            body = error_body(f"internal error: {type(exc).__name__}: {exc}", "internal_server_error")
            return web.json_response(body, status=500)

    def _authorize(self, request: web.Request) -> None:
        if self.api_key is None:
            return
        # aiohttp keeps undecodable header bytes as surrogates: encode them back, never fail on them
        sent = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        if not secrets.compare_digest(sent, f"Bearer {self.api_key}".encode()):
            message = "invalid or missing API key: send the header 'Authorization: Bearer <api key>'"
            raise ApiError(401, message, "invalid_request_error", code="invalid_api_key")

    async def _body(self, request: web.Request) -> dict[str, Any]:
        raw = await request.read()
        return await asyncio.to_thread(protocol.parse_json_object, raw)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(responses.models_response(self.model_name, self._created))

    async def _model(self, request: web.Request) -> web.Response:
        protocol.check_model({"model": request.match_info["model_id"]}, self.model_name)
        return web.json_response(responses.models_response(self.model_name, self._created)["data"][0])

    async def _openapi(self, request: web.Request) -> web.Response:
        return web.json_response(openapi_schema(self.limits, self.model_name))

    async def _chat_answer(self, chat: protocol.ChatRequest) -> dict[str, Any]:
        """The `chat.completion` object of a parsed chat request (limits checked, engine called)."""
        check_text_size(chat.text_chars, self.limits, "messages")
        check_sampling(chat.sampling, 0, self.limits, _OPENAI_NAMES)  # before the cost of rendering
        prompt = await self._lanes.render(chat)
        check_sampling(chat.sampling, len(prompt), self.limits, _OPENAI_NAMES | {"prompt": "messages"})
        sampling = await asyncio.to_thread(self._constrain, chat)
        outputs = await self._engine_call(prompt, sampling)
        tags = self._tool_tags if chat.parse_tool_calls else None
        answer: dict[str, Any] = await self._lanes.ordinary.run(
            responses.chat_response,
            self.model_name,
            len(prompt),
            outputs,
            self.tokenizer,
            chat.logprobs,
            tags,
            chat.tool_plan.single,
        )
        return answer

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        protocol.check_model(body, self.model_name)
        chat = await asyncio.to_thread(protocol.parse_chat, body, self.max_new_tokens_default)
        answer = await self._chat_answer(chat)
        if chat.stream:
            return await send_events(request, chat_chunks(answer, chat.include_usage))
        return web.json_response(answer)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        protocol.check_model(body, self.model_name)
        parsed = await asyncio.to_thread(responses_api.parse_responses, body, self.max_new_tokens_default)
        answer = await self._chat_answer(parsed.chat)
        result = responses_api.response_object(self.model_name, parsed, answer)
        if parsed.chat.stream:
            return await send_typed_events(request, responses_api.response_events(result, PIECE_CHARS))
        return web.json_response(result)

    def _constrain(self, chat: protocol.ChatRequest) -> SamplingParams:
        """The chat's sampling with the grammar of its forced tool calls or response format, if any."""
        if chat.tool_plan.forced:
            grammar = constraints.tool_grammar(chat.tool_plan, self._tool_tags)
        elif chat.response_schema is not None:
            grammar = constraints.json_grammar(chat.response_schema)
        else:
            return chat.sampling
        return dataclasses.replace(chat.sampling, grammar=grammar)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        protocol.check_model(body, self.model_name)
        completion = await asyncio.to_thread(protocol.parse_completion, body, self.max_new_tokens_default)
        check_sampling(completion.sampling, 0, self.limits, _OPENAI_NAMES)
        if isinstance(completion.prompt, str):
            check_text_size(len(completion.prompt), self.limits, "prompt")
            prompt = await self._lanes.encode(completion.prompt)
        else:
            await asyncio.to_thread(check_token_ids, completion.prompt, self.limits, "prompt")
            prompt = list(completion.prompt)
        if not prompt:
            raise ApiError.bad_request("the prompt encodes to no tokens", "prompt")
        check_sampling(completion.sampling, len(prompt), self.limits, _OPENAI_NAMES)
        outputs = await self._engine_call(
            prompt, completion.sampling, prompt_logprobs=completion.prompt_logprobs, prompt_param="prompt"
        )
        answer = await self._lanes.ordinary.run(
            responses.completion_response,
            self.model_name,
            len(prompt),
            outputs,
            self.tokenizer,
            completion.logprobs,
            completion.top_logprobs,
            completion.prompt_logprobs is not None,
        )
        if completion.stream:
            return await send_events(request, completion_chunks(answer, completion.include_usage))
        return web.json_response(answer)

    async def _generate(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        token_request = await asyncio.to_thread(
            protocol.parse_token_request, body, self.max_new_tokens_default
        )
        await asyncio.to_thread(
            check_token_ids, token_request.prompt_token_ids, self.limits, "prompt_token_ids"
        )
        check_sampling(token_request.sampling, len(token_request.prompt_token_ids), self.limits, _TOKEN_NAMES)
        outputs = await self._engine_call(
            token_request.prompt_token_ids, token_request.sampling, token_request.multi_modal
        )
        request_id = outputs[0].request_id if outputs else ""
        if token_request.routed_experts:  # base64 of the records: off the event loop, as parsing is
            answer = await asyncio.to_thread(responses.token_response, request_id, outputs, True)
        else:
            answer = responses.token_response(request_id, outputs)
        return web.json_response(answer)
