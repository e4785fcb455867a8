"""The one interface every rollout engine implements: token ids in, token ids and log-probs out.

The trainer and the agent loops only see `RolloutEngine`; the built-in PyTorch engine
(`quartet.rollout.torch.engine`) and a vLLM engine (when installed) sit behind it.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Iterable, Sequence

import torch

from quartet.rollout.types import GenerationOutput, GenerationRequest

__all__ = ["EngineStateError", "RolloutEngine"]


class EngineStateError(RuntimeError):
    """A call the engine cannot take in its current state (asleep, shut down, busy)."""


class RolloutEngine(abc.ABC):
    """Generates responses to prompts given as token ids; takes weight updates from the trainer."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        """Responses to each request, in request order: `result[i][j]` is sample j of request i."""

    async def generate_one(self, request: GenerationRequest) -> list[GenerationOutput]:
        """The `request.sampling.n` responses to one request, awaitable from an agent loop.

        The default runs `generate` in a worker thread; engines with a scheduler of their own override it so
        that concurrent calls are batched together.
        """
        results = await asyncio.to_thread(self.generate, [request])
        return results[0]

    @abc.abstractmethod
    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> int:
        """Copy trainer weights (transformers parameter names) into the engine's model; returns how many.

        Sequences in flight continue with the new weights: finish a batch before pushing weights to stay
        on-policy. `version` (when given) becomes `weight_version`; engines that tag tokens tag those
        generated after the load with it.
        """

    @property
    def weight_version(self) -> int:
        """Version of the weights the engine holds; engines without versions say 0."""
        return 0

    @abc.abstractmethod
    def sleep(self, offload_weights: bool = False) -> None:
        """Free the KV cache (and, with `offload_weights`, move the weights to host memory) until `wake`."""

    @abc.abstractmethod
    def wake(self) -> None:
        """Undo `sleep`: weights back on the device; the KV cache is recreated on the next request."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Abort everything in flight and release the engine's resources; idempotent."""
