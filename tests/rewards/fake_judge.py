"""A fake OpenAI-compatible judge: a real aiohttp server on an ephemeral port, in a thread of its own.

Its reply depends on a word in the judge prompt (the rubric puts the response in it), so each response of
a test chooses how the judge behaves:

    GOOD<n>   reply "... Score: <n>"             FLAKY<n>  HTTP 500 on the first attempt, then as GOOD<n>
    TAG<n>    reply "<score><n></score>"         SLOW<n>   no answer for 5 s the first time, then as GOOD<n>
    GARBAGE   reply without a verdict            DEAD      HTTP 500 on every attempt
    HIGH      reply "Score: 42" (out of range)   REJECT    HTTP 400 (not retried)

Every request is counted per prompt (`requests[prompt]`), server side, so tests see what was sent.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from typing import Any

from aiohttp import web

SLOW_S = 5.0


class FakeJudge:
    """Start with `url = judge.start()`, stop with `judge.stop()` (or use as a context manager)."""

    def __init__(self, api_key: str | None = None) -> None:
        self.api_key = api_key
        self.requests: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> FakeJudge:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> str:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self.url

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        prompt = body["messages"][-1]["content"]
        self.requests[prompt] += 1
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        first = self.requests[prompt] == 1
        if "DEAD" in prompt:
            return web.json_response({"error": {"message": "down"}}, status=500)
        if "REJECT" in prompt:
            return web.json_response({"error": {"message": "no such model"}}, status=400)
        if "FLAKY" in prompt and first:
            return web.json_response({"error": {"message": "overloaded"}}, status=500)
        if "SLOW" in prompt and first:
            await asyncio.sleep(SLOW_S)
        return web.json_response(_completion(body["model"], _reply(prompt)))


def _reply(prompt: str) -> str:
    if "GARBAGE" in prompt:
        return "I refuse to grade; bananas are yellow."
    if "HIGH" in prompt:
        return "Great work.\nScore: 42"
    tag = re.search(r"TAG(\d+)", prompt)
    if tag:
        return f"Reasoning...\n<score>{tag.group(1)}</score>"
    good = re.search(r"(?:GOOD|FLAKY|SLOW)(\d+)", prompt)
    if good:
        return f"The response is fine.\nScore: {good.group(1)}"
    return "Score: 0"


def _completion(model: str, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }
