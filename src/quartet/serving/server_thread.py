"""Run an `OpenAIServer` from plain threads: its own event loop in a daemon thread.

Ray actor methods, the trainer and tests are synchronous; they start a server with
`url = ServerThread(server).start()`, put it to sleep around a training step with `.sleep()` / `.wake()`,
and end with `.stop()`. Every call waits at most `timeout_s` for the loop thread. Coroutines of the server
(`generate_tokens`) may also be run on that loop from other threads with `call`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from quartet.serving.openai_server import OpenAIServer

__all__ = ["ServerThread"]

T = TypeVar("T")


class ServerThread:
    """An `OpenAIServer` served by an event loop in a background thread."""

    def __init__(self, server: OpenAIServer, timeout_s: float = 60.0) -> None:
        """timeout_s: longest wait of `start`, `stop` and `call` (see `sleep` for its own bound)."""
        self.server = server
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        """Start the loop thread and the server; returns the base URL (`http://host:port/v1`)."""
        if self._thread is not None:
            raise RuntimeError("the server thread is already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="quartet-openai-server", daemon=True)
        self._thread.start()
        try:
            return self.call(self.server.start())
        except BaseException:
            self._close_loop()
            raise

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on the server's loop; wait at most `timeout_s` (default: the thread's)"""
        if self._loop is None:
            coro.close()
            raise RuntimeError("the server thread is not started")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.timeout_s if timeout_s is None else timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def sleep(self, offload_weights: bool = False) -> None:
        """OpenAIServer.sleep: refuse requests, drain and sleep the engine (within request_timeout_s)."""
        self.call(
            self.server.sleep(offload_weights=offload_weights), self.server.request_timeout_s + self.timeout_s
        )

    def wake(self) -> None:
        """`OpenAIServer.wake`."""
        self.call(self.server.wake())

    def stop(self) -> None:
        """Stop the server and its loop thread; idempotent. The engine keeps running."""
        if self._loop is None:
            return
        try:
            self.call(self.server.stop())
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = None
        self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self.timeout_s)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> ServerThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
