"""Small helpers every Tinker route shares: a JSON body that must be an object, and a future's answer."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from quartet.serving.errors import ApiError

if TYPE_CHECKING:
    from quartet.serving.tinker.state import ServiceState

__all__ = ["future_response", "json_body", "then"]

T = TypeVar("T")


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; 400 naming `body` if it is not JSON or not an object."""
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError as err:
        raise ApiError.bad_request(f"the body is not JSON: {err}", "body") from err
    if not isinstance(body, dict):
        raise ApiError.bad_request("the body must be a JSON object", "body")
    return body


def future_response(
    state: ServiceState,
    work: concurrent.futures.Future[Any],
    model_id: str | None,
    extra: Mapping[str, Any] | None = None,
) -> web.Response:
    """The SDK's "untyped future" for `work`: `{request_id, model_id}`, polled via retrieve_future."""
    request_id = state.accept(work, model_id)
    return web.json_response({"request_id": request_id, "model_id": model_id, **(extra or {})})


def then(
    work: concurrent.futures.Future[Any], on_success: Callable[[Any], T]
) -> concurrent.futures.Future[T]:
    """A future of `on_success(result)` once `work` succeeded; of `work`'s failure (or cancellation)
    otherwise, or of what `on_success` raised. `on_success` runs on the thread that finished `work`."""
    answer: concurrent.futures.Future[T] = concurrent.futures.Future()

    def done(finished: concurrent.futures.Future[Any]) -> None:
        if finished.cancelled():
            answer.cancel()
            return
        error = finished.exception()
        if error is not None:
            answer.set_exception(error)
            return
        try:
            answer.set_result(on_success(finished.result()))
        except Exception as err:
            answer.set_exception(err)

    work.add_done_callback(done)
    return answer
