"""Serving: an OpenAI-compatible server over a rollout engine, and a scheduler over several of them.

`OpenAIServer` puts one `RolloutEngine` behind `/v1/chat/completions`, `/v1/completions`, `/v1/responses`,
`/v1/models` and the token-level `/v1/quartet/generate`, and offers the same token call in process
(`generate_tokens`);
`ServerThread` runs it from plain threads. `RequestScheduler` routes token requests over several replicas
(`OpenAIServer`s here, `HttpReplicaClient`s to remote ones): least outstanding, sticky per conversation,
bounded queue.
"""

from __future__ import annotations

from quartet.serving.errors import (
    ApiError,
    GenerationTimeoutError,
    NoFreeReplicaError,
    ReplicaError,
    ReplicaTimeoutError,
    ServerAsleepError,
)
from quartet.serving.http_client import HttpReplicaClient
from quartet.serving.openai_server import OpenAIServer
from quartet.serving.scheduler import ReplicaClient, RequestScheduler, SchedulerStats
from quartet.serving.server_thread import ServerThread
from quartet.serving.text import TokenizerLike

__all__ = [
    "ApiError",
    "GenerationTimeoutError",
    "HttpReplicaClient",
    "NoFreeReplicaError",
    "OpenAIServer",
    "ReplicaClient",
    "ReplicaError",
    "ReplicaTimeoutError",
    "RequestScheduler",
    "SchedulerStats",
    "ServerAsleepError",
    "ServerThread",
    "TokenizerLike",
]
