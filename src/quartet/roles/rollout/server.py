"""The rollout replica's OpenAI-compatible server, as one object the role holds.

Built when the replica runs agent loops (`rollout.multi_turn.enable`: the loops call the server's
in-process token endpoint, so every trajectory's turns share the engine's batch) or serves other processes
(`rollout.interface=server`: it also listens on HTTP, on a thread of its own). Sleeping and waking go
through it, so that while the actor trains it answers 503 instead of queueing work on a sleeping engine.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

from quartet.config.rollout import ServerConfig
from quartet.rollout.base import RolloutEngine
from quartet.serving import OpenAIServer, ServerThread

__all__ = ["ReplicaServer"]

T = TypeVar("T")

_STOP_TIMEOUT_S = 30.0
_WAKE_TIMEOUT_S = 120.0
_SLEEP_GRACE_S = 30.0  # beyond the longest request, for the requests in the engine to finish


class ReplicaServer:
    """An `OpenAIServer` over the replica's engine; with `http`, listening on its own thread."""

    def __init__(
        self, engine: RolloutEngine, tokenizer: Any, sc: ServerConfig, max_new_tokens: int, http: bool
    ) -> None:
        """Rank r listens on `sc.port + r` (any free port when `sc.port` is 0); `max_new_tokens` is the
        response limit of requests that set none."""
        rank = int(os.environ.get("RANK", "0"))
        self.server = OpenAIServer(
            engine,
            tokenizer,
            sc.model_name,
            host=sc.host,
            port=sc.port + rank if sc.port else 0,
            api_key=sc.api_key or None,
            max_new_tokens_default=max_new_tokens,
            request_timeout_s=sc.request_timeout_s,
            max_n=sc.max_n,
            max_request_tokens=sc.max_request_tokens,
            max_body_bytes=sc.max_body_bytes,
        )
        self.thread: ServerThread | None = None
        if http:
            self.thread = ServerThread(self.server)
            self.thread.start()

    @property
    def url(self) -> str | None:
        """The HTTP base URL (`http://host:port/v1`); None without HTTP."""
        return None if self.thread is None else self.server.url

    def sleep(self) -> None:
        """Refuse new requests (503), wait for those in the engine, then put the engine to sleep."""
        timeout = self.server.request_timeout_s + _SLEEP_GRACE_S
        self._on_loop(self.server.sleep(offload_weights=False), timeout)

    def wake(self) -> None:
        """Wake the engine and admit requests again."""
        self._on_loop(self.server.wake(), _WAKE_TIMEOUT_S)

    def stop(self) -> None:
        """Stop serving (the engine is the role's to shut down)."""
        if self.thread is not None:
            self.thread.stop()
        else:
            asyncio.run(asyncio.wait_for(self.server.stop(), _STOP_TIMEOUT_S))

    def _on_loop(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run a coroutine of the server: on its HTTP loop when it has one, else on a loop of our own."""
        if self.thread is not None:
            return self.thread.call(coro, timeout_s)
        return asyncio.run(asyncio.wait_for(coro, timeout_s))
