"""A replica client over HTTP: `generate_tokens` against a remote server's `/v1/quartet/generate`.

The remote side is an `OpenAIServer`; the body carries every `SamplingParams` field, so the remote engine
samples exactly as a local call would, and its answer is read back into `GenerationOutput`s (per-token
weight versions included, and with `routed_experts=True` each response's MoE routing record,
`quartet.serving.routing_wire`). A non-200 answer raises `ReplicaError` with the server's message (503 while
the remote engine sleeps, 504 on its timeout), and so does a 200 whose body is not a well-formed answer
(a routing record of the wrong shape, say): that call fails, nothing else. The aiohttp session is opened
on first use, in the running loop, and closed by `close()`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import aiohttp

from quartet.rollout.types import GenerationOutput, SamplingParams
from quartet.serving.errors import ReplicaError
from quartet.serving.images import multi_modal_to_json
from quartet.serving.protocol import sampling_to_json
from quartet.serving.responses import output_from_json

__all__ = ["HttpReplicaClient"]


class HttpReplicaClient:
    """`generate_tokens` of a remote `OpenAIServer`, for the `RequestScheduler`."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        *,
        routed_experts: bool = False,
    ) -> None:
        """base_url: the server's `http://host:port/v1`; timeout_s: longest wait for one answer;
        routed_experts: ask for (and require) each response's MoE routing record (routing replay)."""
        self.base_url = base_url.rstrip("/")
        self.routed_experts = routed_experts
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key is not None else {}

    async def generate_tokens(
        self,
        prompt_ids: Sequence[int],
        sampling: SamplingParams,
        multi_modal: Mapping[str, Any] | None = None,
    ) -> list[GenerationOutput]:
        """The `sampling.n` responses of the remote engine to a prompt of token ids (and its images, for a
        vision-language model: `quartet.serving.images`)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        url = f"{self.base_url}/quartet/generate"
        body: dict[str, Any] = {"prompt_token_ids": list(prompt_ids), "sampling": sampling_to_json(sampling)}
        if multi_modal is not None:
            body["multi_modal"] = multi_modal_to_json(multi_modal)
        if self.routed_experts:
            body["return_routed_experts"] = True
        async with self._session.post(url, json=body, headers=self._headers()) as response:
            text = await response.text()
        try:
            payload: Any = json.loads(text)
        except ValueError:
            payload = text
        if response.status != 200:
            error = payload.get("error", {}) if isinstance(payload, dict) else {}
            raise ReplicaError(url, response.status, str(error.get("message", payload)))
        if not isinstance(payload, dict):
            raise ReplicaError(url, response.status, f"not a JSON object: {text[:200]}")
        try:
            request_id = str(payload["request_id"])
            return [
                output_from_json(o, request_id, len(prompt_ids), self.routed_experts)
                for o in payload["outputs"]
            ]
        except (KeyError, TypeError, ValueError) as exc:
            message = f"malformed answer: {type(exc).__name__}: {exc}"
            raise ReplicaError(url, response.status, message) from None

    async def close(self) -> None:
        """Close the HTTP session (a later call opens a new one)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def __aenter__(self) -> HttpReplicaClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
