"""Errors of the serving layer and the OpenAI-style error body they turn into.

`ApiError` carries an HTTP status and the `{"error": {"message", "type", "param", "code"}}` body that OpenAI
clients parse (the official client raises `BadRequestError` for 400, `AuthenticationError` for 401, and so
on, with the message in the exception text). Handlers raise it; one middleware turns it into a response.
The scheduler's errors are plain exceptions: they happen in the caller's process, not behind HTTP.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApiError",
    "GenerationTimeoutError",
    "NoFreeReplicaError",
    "ReplicaError",
    "ReplicaTimeoutError",
    "ServerAsleepError",
    "error_body",
]


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The JSON body of an OpenAI-style error response."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


class ApiError(Exception):
    """A request the server answers with an error status and an OpenAI-style body."""

    def __init__(
        self, status: int, message: str, error_type: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code

    @classmethod
    def bad_request(cls, message: str, param: str | None = None) -> ApiError:
        """400: the body is malformed or asks for something this server does not do."""
        return cls(400, message, "invalid_request_error", param)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


class ServerAsleepError(ApiError):
    """503: the server was put to sleep (a training step holds the device); retry after `wake`."""

    def __init__(self) -> None:
        super().__init__(
            503,
            "the rollout engine is asleep (training step in progress); retry after it wakes",
            "service_unavailable",
            code="engine_asleep",
        )


class GenerationTimeoutError(ApiError):
    """504: the engine did not answer within the server's request timeout (the request was aborted)."""

    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            504,
            f"the rollout engine did not finish the request within {timeout_s:g} s (request_timeout_s); "
            "it was aborted",
            "timeout",
            code="request_timeout",
        )


class ReplicaError(RuntimeError):
    """A remote replica answered a token request with an error status."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url} answered {status}: {message}")
        self.url = url
        self.status = status
        self.message = message


class NoFreeReplicaError(TimeoutError):
    """The scheduler found no replica with a free slot within its queue timeout."""


class ReplicaTimeoutError(TimeoutError):
    """A replica took longer than the scheduler's per-request timeout."""
