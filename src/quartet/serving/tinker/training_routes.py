"""The training calls of the Tinker service: create_model, get_info, forward, forward_backward, optim_step.

Each answers at once with a future (`ServiceState.accept`) except get_info; the work runs on the model's
base thread in the order the client sent it. Everything that can be checked without the model (the body,
the datums' shapes, the loss, the token ids) is checked before anything is queued, so a malformed request
is a 400 naming its field and never reaches the queue.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from quartet.serving.errors import ApiError
from quartet.serving.tinker import backend
from quartet.serving.tinker.adapters import AdamStep, AdapterSpec
from quartet.serving.tinker.backend import NotServedError
from quartet.serving.tinker.checkpoints import RunRecord, metadata_strings
from quartet.serving.tinker.http_body import future_response, json_body, then
from quartet.serving.tinker.state import ServiceState
from quartet.serving.tinker.wire import decode_forward_backward, encode_forward_backward_output

__all__ = ["TrainingRoutes"]

_PROTO = "application/x-protobuf"


class TrainingRoutes:
    """Handlers over a `ServiceState`; `register` adds them to an app."""

    def __init__(self, state: ServiceState) -> None:
        self.state = state

    def register(self, app: web.Application) -> None:
        for name, handler in (
            ("create_model", self.create_model),
            ("get_info", self.get_info),
            ("forward_backward", self.forward_backward),
            ("forward", self.forward),
            ("optim_step", self.optim_step),
            ("unload_model", self.unload_model),
        ):
            app.router.add_post(f"/api/v1/{name}", handler)

    async def create_model(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        base = body.get("base_model")
        if base not in self.state.model_paths:
            raise ApiError.bad_request(
                f"base_model {base!r} is not served (served: {sorted(self.state.model_paths)})", "base_model"
            )
        lora = body.get("lora_config")
        if not isinstance(lora, dict):
            raise NotServedError(
                "full fine-tuning (no lora_config) is not served: create_lora_training_client(rank=...)"
            )
        spec = adapter_spec(lora)
        model_id = self.state.new_model_id()
        session = body.get("session_id")
        metadata = metadata_strings(body.get("user_metadata"))
        s = spec
        record = RunRecord(model_id, str(base), s.rank, s.seed, s.train_attn, s.train_mlp, s.train_unembed,
                           user_metadata=metadata)  # fmt: skip
        reply = {"type": "create_model", "model_id": model_id}
        work = self.state.create_model(record, spec, reply, str(session) if session else None)
        return future_response(self.state, work, model_id)

    async def get_info(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        entry = self.state.model(body.get("model_id"))
        data = {
            "model_name": entry.base_model,
            "tokenizer_id": str(self.state.model_paths[entry.base_model]),
            "arch": None,
        }
        info = {"type": "get_info", "model_id": entry.model_id, "model_data": data, "is_lora": True,
                "lora_rank": entry.spec.rank, "model_name": entry.base_model}  # fmt: skip
        return web.json_response(info)

    async def forward(self, request: web.Request) -> web.Response:
        return await self._forward_backward(request, forward_only=True)

    async def forward_backward(self, request: web.Request) -> web.Response:
        return await self._forward_backward(request, forward_only=False)

    async def _forward_backward(self, request: web.Request, forward_only: bool) -> web.Response:
        if request.headers.get("Content-Encoding", "") not in ("", "identity"):
            raise ApiError.bad_request(
                "compressed bodies are not served (client/config says so)", "Content-Encoding"
            )
        if not request.content_type.startswith(_PROTO):
            raise ApiError.bad_request(
                f"forward_backward takes {_PROTO}, not {request.content_type}", "Content-Type"
            )
        decoded = decode_forward_backward(await request.read(), forward_only)
        entry = self.state.model(decoded.model_id)
        tokens = sum(int(d.tokens.size) for d in decoded.data)
        if tokens > self.state.config.max_tokens_per_request:
            raise ApiError.bad_request(
                f"{tokens} input tokens in one request; the service takes at most "
                f"{self.state.config.max_tokens_per_request} (max_tokens_per_request): send fewer datums",
                "data",
            )
        vocab = self.state.hosts[entry.base_model].host.vocab_size
        config = decoded.loss_fn_config
        backend.check(decoded.loss_fn, decoded.data, vocab, config)  # 400 naming the field, nothing queued

        def run(host: Any) -> bytes:
            outputs, metrics = backend.forward_backward(
                host, entry.model_id, decoded.loss_fn, decoded.data, decoded.forward_only, config
            )
            return encode_forward_backward_output(outputs, metrics)

        return future_response(self.state, self.state.run_on_model(entry.model_id, run), entry.model_id)

    async def optim_step(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        entry = self.state.model(body.get("model_id"))
        if "adam_params" not in body:
            raise NotServedError("optim_step: only adam_params is served (AdamW)")
        adam = adam_step(body["adam_params"])
        work = self.state.run_on_model(
            entry.model_id, lambda host: {"metrics": host.optim_step(entry.model_id, adam)}
        )
        return future_response(self.state, work, entry.model_id)

    async def unload_model(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        entry = self.state.model(body.get("model_id"))
        model_id, models = entry.model_id, self.state.models

        def forget(_: object) -> dict[str, Any]:
            models.pop(model_id, None)
            return {"type": "unload_model", "model_id": model_id}

        work = self.state.run_on_model(model_id, lambda host: host.remove(model_id))
        return future_response(self.state, then(work, forget), model_id)


def adapter_spec(lora: dict[str, Any]) -> AdapterSpec:
    """The `lora_config` of a create_model body as an `AdapterSpec`; 400 naming the field if malformed."""
    known = {"rank", "seed", "train_attn", "train_mlp", "train_unembed"}
    for key, value in lora.items():
        if key not in known:
            continue
        if key == "rank" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ApiError.bad_request("lora_config.rank must be an integer", "lora_config.rank")
        if key == "seed" and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ApiError.bad_request("lora_config.seed must be an integer or null", "lora_config.seed")
        if key.startswith("train_") and not isinstance(value, bool):
            raise ApiError.bad_request(f"lora_config.{key} must be true or false", f"lora_config.{key}")
    try:
        return AdapterSpec(
            rank=lora.get("rank"),  # type: ignore[arg-type]  # checked by AdapterSpec
            seed=int(lora.get("seed") or 0),
            train_attn=lora.get("train_attn", True),
            train_mlp=lora.get("train_mlp", True),
            train_unembed=lora.get("train_unembed", True),
        )
    except ValueError as err:
        field = str(err).partition(":")[0]
        raise ApiError.bad_request(str(err), field) from err


def adam_step(params: object) -> AdamStep:
    """`adam_params` as an `AdamStep`; 400 naming the field if malformed or out of range."""
    names = {f.name for f in dataclasses.fields(AdamStep)}
    if not isinstance(params, dict) or set(params) - names:
        raise ApiError.bad_request(f"adam_params takes {sorted(names)}", "adam_params")
    values: dict[str, float] = {}
    for key, value in params.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise ApiError.bad_request(f"adam_params.{key} must be a number", f"adam_params.{key}")
        values[key] = float(value)
    adam = AdamStep(**values)
    if adam.learning_rate < 0 or not 0 <= adam.beta1 < 1 or not 0 <= adam.beta2 < 1 or adam.eps < 0:
        raise ApiError.bad_request(
            "adam_params: need learning_rate >= 0, 0 <= beta1, beta2 < 1, eps >= 0", "adam_params"
        )
    return adam
