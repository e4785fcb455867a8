"""`stream: true`: a finished response sent as OpenAI server-sent events.

The rollout engine returns a sequence only when it finishes (`generate_one` resolves once per request), so
the server waits for the whole response and then sends it as chunks: per choice, a first chunk with the
role (chat), the text in pieces of at most `PIECE_CHARS` characters, the tool calls (chat, one delta per
call, with its id, name and whole arguments), and a last chunk with `finish_reason`. Token log-probs travel
on the first text chunk. With `stream_options.include_usage`, every chunk carries `"usage": null` and one
more chunk with no choices carries the usage, as OpenAI sends it. The stream ends with `data: [DONE]`.

Errors (a malformed body, a timeout) are answered before the stream starts, as ordinary JSON errors with
their status: the response is complete before the first byte is sent, so a stream never breaks midway.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web

__all__ = ["PIECE_CHARS", "chat_chunks", "completion_chunks", "send_events", "send_typed_events"]

log = logging.getLogger(__name__)

PIECE_CHARS = 64
"""Most characters of text per chunk."""


def _pieces(text: str) -> list[str]:
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def _chunk(response: dict[str, Any], kind: str, choice: dict[str, Any] | None, usage: bool) -> dict[str, Any]:
    chunk = {
        "id": response["id"],
        "object": kind,
        "created": response["created"],
        "model": response["model"],
        "choices": [] if choice is None else [choice],
    }
    if usage:
        chunk["usage"] = None
    return chunk


def _usage_chunk(response: dict[str, Any], kind: str) -> dict[str, Any]:
    return {**_chunk(response, kind, None, True), "usage": response["usage"]}


def chat_chunks(response: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` objects of a finished `chat.completion` object."""
    kind = "chat.completion.chunk"

    def chunk(
        index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return _chunk(response, kind, choice, include_usage)

    for choice in response["choices"]:
        index, message = choice["index"], choice["message"]
        pieces = _pieces(message["content"] or "")
        yield chunk(index, {"role": "assistant", "content": "" if pieces else message["content"]})
        for k, piece in enumerate(pieces):
            yield chunk(index, {"content": piece}, logprobs=choice["logprobs"] if k == 0 else None)
        if not pieces and choice["logprobs"] is not None:
            yield chunk(index, {}, logprobs=choice["logprobs"])
        for k, call in enumerate(message.get("tool_calls", [])):
            yield chunk(index, {"tool_calls": [{"index": k, **call}]})
        yield chunk(index, {}, choice["finish_reason"])
    if include_usage:
        yield _usage_chunk(response, kind)


def completion_chunks(response: dict[str, Any], include_usage: bool) -> Iterator[dict[str, Any]]:
    """The streamed `text_completion` objects of a finished `text_completion` object."""
    kind = "text_completion"
    for choice in response["choices"]:
        pieces = _pieces(choice["text"])
        for k, piece in enumerate(pieces):
            logprobs = choice["logprobs"] if k == 0 else None
            part = {"index": choice["index"], "text": piece, "logprobs": logprobs, "finish_reason": None}
            yield _chunk(response, kind, part, include_usage)
        last = {
            "index": choice["index"],
            "text": "",
            "logprobs": choice["logprobs"] if not pieces else None,
            "finish_reason": choice["finish_reason"],
        }
        yield _chunk(response, kind, last, include_usage)
    if include_usage:
        yield _usage_chunk(response, kind)


async def send_events(request: web.Request, chunks: Iterator[dict[str, Any]]) -> web.StreamResponse:
    """Send `chunks` as server-sent events (`data: <json>`), then `data: [DONE]`."""
    lines = (f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n" for chunk in chunks)
    return await _send(request, lines, b"data: [DONE]\n\n")


async def send_typed_events(request: web.Request, events: Iterator[dict[str, Any]]) -> web.StreamResponse:
    """Send `events` as server-sent events named by their `type` (`event: <type>` + `data: <json>`), as the
    Responses API streams them (no `[DONE]`)."""
    lines = (f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events)
    return await _send(request, lines, b"")


async def _send(request: web.Request, lines: Iterator[str], last: bytes) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    )
    await response.prepare(request)
    try:
        for line in lines:
            await response.write(line.encode())
        if last:
            await response.write(last)
        await response.write_eof()
    except ConnectionResetError:  # the client left mid-stream: nothing left to answer
        log.info("client hung up during the stream of %s %s", request.method, request.path)
    return response
