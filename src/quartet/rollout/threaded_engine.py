"""The request API of the engines that step their model on an `EngineThread` (built-in and vLLM).

`generate` (a batch, blocking), `generate_one` (one request, awaitable) and `abort` are the same for both
engines: check every request first, queue it, wait on its future (a cancelled awaiting caller aborts its
request, so the engine frees its slot). Written once here so the two engines cannot drift apart; each
engine keeps what differs: how a request is checked (`_validate`), how it is admitted and queued
(`_submit`), and what a step does.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Self

from quartet.rollout.base import RolloutEngine
from quartet.rollout.engine_thread import EngineThread
from quartet.rollout.types import GenerationOutput, GenerationRequest

__all__ = ["ThreadedEngine"]


class ThreadedEngine(RolloutEngine):
    """A `RolloutEngine` whose requests are stepped by `self._thread` (set by the subclass)."""

    _thread: EngineThread[Any]

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        """Responses to each request in order: `result[i][j]` is sample j of request i. Blocks until done."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            repeated = sorted({i for i in ids if ids.count(i) > 1})
            raise ValueError(f"request ids repeat within one call: {repeated}")
        for request in requests:
            self._validate(request)
        futures = [self._submit(r) for r in requests]
        return [self._thread.wait(f) for f in futures]

    async def generate_one(self, request: GenerationRequest) -> list[GenerationOutput]:
        """The n responses to one request; concurrent calls share the engine's running batch."""
        self._validate(request)
        future = self._submit(request)  # a cancelled caller gave up: stop generating for it
        return await self._thread.wait_async(future, on_cancel=lambda: self.abort(request.request_id))

    def abort(self, request_id: str) -> None:
        """Stop a request: its samples finish with reason ABORT (with the tokens generated so far where the
        engine keeps them; vLLM returns none)."""
        self._thread.abort(request_id)

    @abc.abstractmethod
    def _validate(self, request: GenerationRequest) -> None:
        """Raise a ValueError before `request` can reach the batch when the engine cannot take it."""

    @abc.abstractmethod
    def _submit(self, request: GenerationRequest) -> Future[list[GenerationOutput]]:
        """Admit and queue `request` on the engine thread; the future its samples settle."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()
