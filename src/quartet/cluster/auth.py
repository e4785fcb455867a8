"""Joining a run's Ray from another process under Ray's token authentication (on by default since 2.5x).

A local `ray.init()` (what a run does when `cluster.address` is empty) turns token authentication on for
itself and its workers (`RAY_AUTH_MODE=token` in its environment) and reads the token from
`RAY_AUTH_TOKEN`, else the file `RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token` (generated on first use).
Another process that joins with an explicit address (`cluster.json`'s, `--address host:port`) does NOT
turn it on: Ray enables it only for `address="auto"`. Its connection is then refused (`InvalidAuthToken`)
after ~20 s of repeated warnings, and the user is told there is no cluster. `join` enables token
authentication when this machine has a token (and `RAY_AUTH_MODE` is not set), and names the cause when the
connection fails: the token refused, or nothing listening.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["ClusterAuthError", "enable_token_auth", "join", "token_source"]

log = logging.getLogger(__name__)
AUTH_MODE = "RAY_AUTH_MODE"
DEFAULT_TOKEN = Path("~/.ray/auth_token")


class ClusterAuthError(ConnectionError):
    """Something listens at the address, but refused this process's Ray authentication token."""


def token_source() -> str | None:
    """Where Ray would read this process's token: the `RAY_AUTH_TOKEN` variable, the file named by
    `RAY_AUTH_TOKEN_PATH`, or `~/.ray/auth_token`; None when there is none."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "the RAY_AUTH_TOKEN variable"
    custom = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if custom:
        return custom if Path(custom).expanduser().is_file() else None
    default = DEFAULT_TOKEN.expanduser()
    return str(default) if default.is_file() else None


def enable_token_auth() -> bool:
    """Turn Ray's token authentication on for this process (before `ray.init`) when this machine has a
    token and `RAY_AUTH_MODE` is unset; an explicit `RAY_AUTH_MODE` is respected. True when on."""
    mode = os.environ.get(AUTH_MODE)
    if mode is not None:
        return mode.lower() == "token"
    if token_source() is None:
        return False
    os.environ[AUTH_MODE] = "token"  # inherited by the processes this one starts (doctor's probes)
    import ray

    if ray.is_initialized():  # the config is read at `ray.init`: nothing to refresh
        return True
    try:  # refresh Ray's cached config, as Ray does for `address="auto"` (a private API: best effort)
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
    except (ImportError, AttributeError) as err:  # pragma: no cover - another Ray version
        log.debug("could not refresh Ray's config after setting %s: %s", AUTH_MODE, err)
    return True


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Ray's C++ client logs a warning per retry (20 lines for a refused token) on file descriptor 2:
    held back while joining; the failure is reported once, with its cause, instead."""
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _auth_refused(err: BaseException) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        if "InvalidAuthToken" in str(seen) or type(seen).__name__ == "AuthenticationError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def join(address: str, namespace: str, retries: int | None = None, **init_kwargs: Any) -> None:
    """`ray.init(address, namespace, ...)` from a process outside the run, with token authentication on
    when this machine has a token; `ClusterAuthError` when the token is refused, `ConnectionError` else.

    retries: connection attempts, ~1 s each (Ray's `RAY_gcs_server_port_wait_time_s`, default 20), unless
        that variable is set; a refused token costs them all.
    """
    import ray

    enabled = enable_token_auth()
    if retries is not None:
        os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(retries))
    try:
        with _quiet_stderr():
            ray.init(address=address, namespace=namespace, **init_kwargs)
    except (ConnectionError, RuntimeError) as err:
        if not _auth_refused(err):
            raise
        source = token_source()
        used = f"the token from {source}" if enabled and source else "no token"
        raise ClusterAuthError(
            f"the Ray cluster at '{address}' is running but refused this process's authentication token "
            f"(InvalidAuthToken; Ray token authentication is on, this process sent {used}). Fix: run this "
            "as the user that started the cluster (its token is that user's ~/.ray/auth_token), or set "
            "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token"
        ) from None
