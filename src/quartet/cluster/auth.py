"""Joining a Ray cluster from another process with the cluster's own token-authentication mode.

Ray 2.5x+ has two modes, chosen per process by `RAY_AUTH_MODE` (`token` or `disabled`), and every process
of one cluster must use the same one: a token-mode process refuses calls without a token, a cluster
started without it never sends one. A local `ray.init()` (what a run does when `cluster.address` is
empty) turns token authentication on and reads the token from `RAY_AUTH_TOKEN`, else the file
`RAY_AUTH_TOKEN_PATH`, else `~/.ray/auth_token` (generated on first use). A `ray start` cluster uses the
mode its starter's environment had, and many run with `RAY_AUTH_MODE=disabled`.

So a process that joins must follow the cluster, not guess from its own machine. Ray gives a joining
process no way to read the cluster's mode, so `join` asks the cluster: one GCS call without a token
(`cluster_requires_token`, a few ms) is refused as unauthenticated exactly when the cluster has token
authentication on. Guessing "token" because a token file exists (what Ray does for `address="auto"`)
made every run on a cluster without authentication fail ~15 s in, its actors cancelled before they ran
("Missing authorization header" in Ray's logs); guessing "off" for an explicit address made a
token-authenticated cluster refuse the connection (`InvalidAuthToken`) after ~20 s of warnings. An
explicit `RAY_AUTH_MODE` that contradicts the cluster, or a token missing for a cluster that needs one, is
a `ClusterAuthError` naming the fix before `ray.init` is called.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "ClusterAuthError",
    "cluster_requires_token",
    "enable_token_auth",
    "join",
    "match_cluster_auth",
    "token_source",
]

log = logging.getLogger(__name__)
AUTH_MODE = "RAY_AUTH_MODE"
DEFAULT_TOKEN = Path("~/.ray/auth_token")
# A GCS call every Ray version since 2.x answers, with an empty request: used only to see whether a call
# without a token is let through.
_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
_MODE_SET_HERE: dict[str, str | None] = {"mode": None}  # what `_set_mode` put in RAY_AUTH_MODE, if anything
_TOKEN_FIX = (
    "run this as the user that started the cluster (its token is that user's ~/.ray/auth_token), or set "
    "RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token"
)


class ClusterAuthError(ConnectionError):
    """The cluster at an address and this process disagree on Ray's authentication: its token refused, a
    token it needs missing, or a `RAY_AUTH_MODE` here that contradicts the cluster's (`fix` then says how
    to change it; empty for a token problem, whose fix depends on who runs what)."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


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


def _explicit_mode() -> str | None:
    """`RAY_AUTH_MODE` as the user set it (lower case); None when unset or set by this module for an
    earlier join, which a later join may change."""
    mode = os.environ.get(AUTH_MODE)
    if mode is None or mode == _MODE_SET_HERE["mode"]:
        return None
    return mode.lower()


def _set_mode(mode: str) -> None:
    """Put `mode` in `RAY_AUTH_MODE` (inherited by the processes this one starts: doctor's probes) and
    refresh Ray's cached config, which read it at import (a private API, as Ray itself does: best effort)."""
    os.environ[AUTH_MODE] = mode
    _MODE_SET_HERE["mode"] = mode
    import ray

    if ray.is_initialized():  # the config is read at `ray.init`: nothing to refresh
        return
    try:
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
    except (ImportError, AttributeError) as err:  # pragma: no cover - another Ray version
        log.debug("could not refresh Ray's config after setting %s: %s", AUTH_MODE, err)


def enable_token_auth() -> bool:
    """Turn Ray's token authentication on for this process (before `ray.init`) when this machine has a
    token and `RAY_AUTH_MODE` is unset; an explicit `RAY_AUTH_MODE` is respected. True when on. The guess
    for a cluster whose mode cannot be asked (`cluster_requires_token` None)."""
    mode = os.environ.get(AUTH_MODE)
    if mode is not None:
        return mode.lower() == "token"
    if token_source() is None:
        return False
    _set_mode("token")
    return True


def cluster_requires_token(address: str, timeout_s: float = 5.0) -> bool | None:
    """Whether the Ray GCS at `host:port` has token authentication on: True when a call without a token
    is refused as unauthenticated, False when it is answered; None when that cannot be told (a Ray Client
    `ray://` address, TLS, no answer in `timeout_s`, another error)."""
    if address.startswith("ray://") or os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    import grpc  # type: ignore[import-untyped]  # Ray's dependency; no stubs installed

    channel = grpc.insecure_channel(address)
    try:
        call = channel.unary_unary(_PROBE_METHOD, request_serializer=lambda _: b"")
        call(None, timeout=timeout_s)
        return False
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            return True
        log.debug("could not tell whether %s requires a Ray token: %s", address, err)
        return None
    finally:
        channel.close()


def _mode_conflict(address: str, mode: str, requires: bool) -> ClusterAuthError:
    fix = f"unset {AUTH_MODE} (quartet follows the cluster's mode) or set {AUTH_MODE}="
    if requires:
        fix += f"token; and {_TOKEN_FIX}"
        why = f"{AUTH_MODE}={mode}, so Ray would refuse it (InvalidAuthToken)"
        return ClusterAuthError(
            f"the Ray cluster at '{address}' has token authentication on, but this process has {why}. "
            f"Fix: {fix}",
            fix,
        )
    fix += "disabled"
    why = (
        f"{AUTH_MODE}={mode}: the cluster's workers would call it without a token and be refused (its "
        "actors die before they start; Ray's logs say 'Missing authorization header')"
    )
    return ClusterAuthError(
        f"the Ray cluster at '{address}' runs without token authentication, but this process has {why}. "
        f"Fix: {fix}",
        fix,
    )


def match_cluster_auth(address: str, requires: bool | None) -> bool:
    """Set this process's Ray authentication mode to the cluster's (`requires`, from
    `cluster_requires_token`; None: `enable_token_auth`'s guess); True when token authentication is on.
    `ClusterAuthError` when an explicit `RAY_AUTH_MODE` contradicts the cluster or it needs a token this
    process lacks."""
    if requires is None:
        return enable_token_auth()
    explicit = _explicit_mode()
    if explicit is not None and (explicit == "token") != requires:
        raise _mode_conflict(address, explicit, requires)
    if requires and token_source() is None:
        raise ClusterAuthError(
            f"the Ray cluster at '{address}' has token authentication on, but this process has no token "
            f"(no RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or {DEFAULT_TOKEN}). Fix: {_TOKEN_FIX}"
        )
    if explicit is None:
        _set_mode("token" if requires else "disabled")
    return requires


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


def join(address: str, namespace: str, retries: int | None = None, **init_kwargs: Any) -> bool:
    """`ray.init(address, namespace, ...)` from a process outside the run, in the cluster's authentication
    mode (`match_cluster_auth`); True when token authentication is on. `ClusterAuthError` when the modes
    conflict or the token is refused, `ConnectionError` else.

    retries: connection attempts, ~1 s each (Ray's `RAY_gcs_server_port_wait_time_s`, default 20), unless
        that variable is set; a refused token costs them all.
    """
    import ray

    enabled = match_cluster_auth(address, cluster_requires_token(address))
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
            f"(InvalidAuthToken; Ray token authentication is on, this process sent {used}). Fix: "
            f"{_TOKEN_FIX}"
        ) from None
    return enabled
