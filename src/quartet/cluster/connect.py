"""Which Ray a process uses, and joining it within a bounded time or failing with the cause and the fix.

`cluster.address` has one meaning, whatever the machine runs:

- `""` (default): the Ray cluster this environment points at, else a local Ray for this run. It points at
  one when `RAY_ADDRESS` is set (`ray job submit` sets it for the job's driver) or when a cluster started
  with `ray start` runs on this machine (Ray's record `<ray temp dir>/ray_current_cluster`); a record whose
  cluster is gone is ignored with a warning.
- `auto`: an existing cluster is required (the same lookup; none found is an error).
- `local`: always a local Ray for this run, even beside a running cluster or with `RAY_ADDRESS` set.
- `host:port` (the GCS address `ray status` prints) or `ray://host:port` (Ray Client).

Ray's own `ray.init` does the same lookup but then refuses the arguments quartet passes to a Ray it starts
(`num_cpus`, `_system_config`), and joining an address where no Ray answers retries for minutes with
SIGTERM ignored. Here a join is checked first: something must listen (TCP, `timeout_s`) and speak gRPC
(Ray's GCS protocol) before `ray.init` is called, whose own retries are capped by
`RAY_gcs_server_port_wait_time_s`, in the cluster's own token-authentication mode (`quartet.cluster.auth`).
Each failure is a `RayConnectError` naming the address, where it came from, the cause (nothing listening,
not a Ray GCS, authentication token refused or modes in conflict, Ray/Python version mismatch) and the fix.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Literal

from quartet.cluster.auth import ClusterAuthError, join

__all__ = [
    "RayConnectError",
    "RayTarget",
    "check_listening",
    "join_bounded",
    "not_listening",
    "resolve_target",
    "target_of",
]

log = logging.getLogger(__name__)

ENV_ADDRESS = "RAY_ADDRESS"
_WAIT_VAR = "RAY_gcs_server_port_wait_time_s"
_PORT_HINT = (
    "the GCS port (`ray status` or `ray start`'s output prints it; 6379 by default), not the dashboard "
    "(8265) or Ray Client (10001) port"
)


class RayConnectError(ConnectionError):
    """No Ray cluster could be joined at an address: the message names the address, its source, the cause
    and the fix."""


@dataclass(frozen=True)
class RayTarget:
    """The Ray a run uses: join `address`, or start a local one (`address` None); `source` says why."""

    mode: Literal["join", "start"]
    address: str | None
    source: str

    def describe(self) -> str:
        if self.mode == "start":
            return f"a local Ray for this run ({self.source})"
        return f"the Ray cluster at {self.address} ({self.source})"


def _recorded_cluster() -> tuple[str, str] | None:
    """(address, record file) of the last `ray start` cluster on this machine, from Ray's record."""
    try:
        from ray._common.utils import get_ray_address_file  # private: where `ray start` writes its address
    except ImportError:  # pragma: no cover - another Ray version: no record lookup
        return None
    path = get_ray_address_file(None)
    try:
        with open(path) as f:
            address = f.read().strip()
    except OSError:
        return None
    return (address, path) if address else None


def _running_gcs() -> list[str]:
    """GCS addresses of the Ray clusters running on this machine (Ray's process lookup, as its `auto`)."""
    try:
        from ray._private.services import find_gcs_addresses  # private: Ray's own `auto` fallback
    except ImportError:  # pragma: no cover - another Ray version
        return []
    return sorted(set(find_gcs_addresses()))  # type: ignore[no-untyped-call]


def resolve_target(address: str, connect_timeout_s: float = 5.0) -> RayTarget:
    """What `cluster.address` means here and now (see the module docstring); raises `RayConnectError` for
    `auto` without a cluster."""
    address = address.strip()
    if address == "local":
        return RayTarget("start", None, "cluster.address=local")
    if address and address != "auto":
        return RayTarget("join", address, "cluster.address")
    env = os.environ.get(ENV_ADDRESS, "").strip()
    if env.startswith(("http://", "https://")):
        raise RayConnectError(
            f"{ENV_ADDRESS}={env} is a Ray Jobs (dashboard) address, which `ray job submit` uses; a run "
            "joins a cluster by its GCS address. Fix: submit the run as a job (`ray job submit -- quartet "
            "train ...`, which sets the right address), set cluster.address=host:port (the GCS address), "
            f"or unset {ENV_ADDRESS} to start a local Ray"
        )
    if env == "local":
        return RayTarget("start", None, f"{ENV_ADDRESS}=local")
    if env and env != "auto":
        return RayTarget("join", env, f"{ENV_ADDRESS} is set (as inside `ray job submit`)")
    recorded = _recorded_cluster()
    if recorded is not None:
        found, path = recorded
        why = not_listening(found, connect_timeout_s)
        if why is None:
            return RayTarget("join", found, f"the `ray start` cluster on this machine, recorded in {path}")
        log.warning("ignoring %s: the `ray start` cluster it records (%s) is gone: %s", path, found, why)
    if address == "auto":
        running = _running_gcs()
        if len(running) == 1:
            return RayTarget("join", running[0], "cluster.address=auto: the one Ray running on this machine")
        if running:
            raise RayConnectError(
                f"cluster.address=auto, but {len(running)} Ray clusters run on this machine ({running}) and "
                "none is recorded by `ray start`. Fix: pass one as cluster.address=host:port"
            )
        raise RayConnectError(
            "cluster.address=auto, but no running Ray cluster was found on this machine "
            f"({ENV_ADDRESS} is not set and no live `ray start` cluster is recorded). Fix: start one "
            "(`ray start --head`), set cluster.address=host:port, or leave cluster.address empty to "
            "start a local Ray for this run"
        )
    why = f"cluster.address is empty, {ENV_ADDRESS} is not set and no `ray start` cluster runs here"
    return RayTarget("start", None, why)


def _host_port(address: str) -> tuple[str, int] | None:
    bare = address.removeprefix("ray://")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def not_listening(address: str, timeout_s: float) -> str | None:
    """None if something accepts TCP connections at `address`, else why not."""
    parsed = _host_port(address)
    if parsed is None:
        return None
    try:
        with socket.create_connection(parsed, timeout=timeout_s):
            return None
    except OSError as err:
        return f"nothing is listening there ({err})"


def _speaks_grpc(address: str, timeout_s: float) -> bool:
    """Whether the server at `host:port` completes a gRPC (HTTP/2) handshake, as Ray's GCS does."""
    import grpc  # type: ignore[import-untyped]  # Ray's dependency; no stubs installed

    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout_s)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def check_listening(address: str, source: str, timeout_s: float) -> None:
    """Raise `RayConnectError` unless a Ray GCS (or Ray Client server, for `ray://`) answers at `address`."""
    if _host_port(address) is None:
        raise RayConnectError(
            f"cannot join Ray at '{address}' (from {source}): not an address. Fix: use host:port "
            f"({_PORT_HINT}), ray://host:port, auto or local, or leave it empty"
        )
    why = not_listening(address, timeout_s)
    if why is not None:
        raise RayConnectError(
            f"cannot join the Ray cluster at {address} (from {source}): {why}. Fix: start it (`ray start "
            f"--head --port=...`), check the host and port ({_PORT_HINT}), or leave cluster.address empty "
            "to start a local Ray for this run"
        )
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
    if not address.startswith("ray://") and not tls and not _speaks_grpc(address, timeout_s):
        raise RayConnectError(
            f"cannot join the Ray cluster at {address} (from {source}): something listens there but did "
            f"not answer as a Ray GCS (no gRPC handshake within {timeout_s:g} s). Fix: use {_PORT_HINT}"
        )


def _explain(err: BaseException, address: str, source: str) -> str | None:
    text = str(err)
    flat = " ".join(text.split())
    if "Version mismatch" in text or "version mismatch" in text:
        return (
            f"cannot join the Ray cluster at {address} (from {source}): Ray or Python versions differ "
            f"between the cluster and this process ({flat}). Fix: install the "
            "cluster's Ray version with the same Python minor version here (or restart the cluster with "
            "this environment's)"
        )
    if isinstance(err, ConnectionError | TimeoutError):
        return (
            f"cannot join the Ray cluster at {address} (from {source}): {text.strip().splitlines()[0]}. "
            f"Fix: check that the cluster is up (`ray status --address {address}`) and reachable from "
            "this machine"
        )
    return None


def target_of(address: str, source: str) -> RayTarget:
    """The cluster a tool outside a run joins: `address` as given (`""` and `auto`: the one running on
    this machine, as `resolve_target("auto")`)."""
    if address.strip() in ("", "auto"):
        return resolve_target("auto")
    return RayTarget("join", address.strip(), source)


def join_bounded(
    target: RayTarget, namespace: str, timeout_s: float = 30.0, retries: int | None = None, **init: Any
) -> bool:
    """`ray.init` into the cluster of `target` (mode `join`) in `namespace`, bounded by `timeout_s` for the
    checks and `retries` (~1 s each, default `timeout_s`) for Ray's own GCS wait, with token authentication
    on exactly when the cluster has it (the return value). Every failure is a `RayConnectError`
    (`ClusterAuthError` for a refused token or conflicting modes) naming address, source, cause and fix."""
    assert target.mode == "join" and target.address, target
    address = target.address
    check_listening(address, target.source, min(timeout_s, 10.0))
    os.environ.setdefault(_WAIT_VAR, str(max(1, int(retries if retries is not None else timeout_s))))
    try:
        return join(address, namespace, **init)
    except ClusterAuthError:
        raise
    except Exception as err:
        message = _explain(err, address, target.source)
        if message is None:
            raise
        raise RayConnectError(message) from err
