"""Which rank failed first, and why: the error a multi-rank call raises names the cause, not a symptom.

When a node is lost during a collective (the actor update's all-reduce), the SURVIVING ranks fail first:
their gloo/NCCL connection to the lost peer resets at once, while Ray reports the lost actor only after it
notices the death (a dropped connection to the worker, or the node's missed health checks). Reporting the
first error seen would name a healthy rank on a healthy node. So when the first failure is a
communication error, the others get a bounded grace period to fail too; then the report leads with a rank
whose node Ray marks dead, else a rank whose actor died, else the lowest failed rank, and lists the other
failures as consequences.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quartet.cluster.errors import WorkerError

__all__ = ["PEER_GRACE_S", "RankFailure", "dead_nodes", "failure_report", "is_peer_error"]

log = logging.getLogger(__name__)

PEER_GRACE_S = 30.0
"""Longest wait for the other ranks after a communication error, for the lost rank's own report."""

_PEER_MARKERS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "gloo",
    "nccl",
    "socket closed",
    "timed out in",  # gloo: "Timed out waiting ... for recv"
    "connection refused",
)


@dataclass(frozen=True)
class RankFailure:
    """One failed rank: `died` when its actor (process or node) is gone, else the exception it raised."""

    rank: int
    died: bool
    cause: str
    error: BaseException


def is_peer_error(failure: RankFailure) -> bool:
    """Whether a rank's error looks like a lost peer in a collective (a consequence, not a cause)."""
    text = failure.cause.lower()
    return not failure.died and any(marker in text for marker in _PEER_MARKERS)


def dead_nodes() -> dict[str, str]:
    """Node id -> IP of the nodes Ray marks dead (an empty dict when Ray cannot tell)."""
    import ray

    try:
        return {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes() if not n.get("Alive")}  # type: ignore[no-untyped-call]
    except Exception as err:  # the GCS itself unreachable: no node facts to add
        log.debug("ray.nodes() failed: %s", err)
        return {}


def unreachable_nodes(node_ids: set[str], timeout_s: float = 2.0) -> dict[str, str]:
    """Node id -> IP of those of `node_ids` whose raylet does not accept a connection: a node whose
    processes or machine are gone, known at once (Ray marks it dead only after its missed health checks)."""
    import ray

    try:
        nodes = [n for n in ray.nodes() if n["NodeID"] in node_ids]  # type: ignore[no-untyped-call]
    except Exception as err:
        log.debug("ray.nodes() failed: %s", err)
        return {}
    out = {}
    for node in nodes:
        ip, port = node.get("NodeManagerAddress", ""), node.get("NodeManagerPort", 0)
        if not node.get("Alive"):
            out[node["NodeID"]] = ip
            continue
        try:
            with socket.create_connection((ip, int(port)), timeout=timeout_s):
                pass
        except (OSError, ValueError):
            out[node["NodeID"]] = ip
    return out


def failures_of(refs: list[Any], method: str) -> list[RankFailure]:
    """The failures among the finished refs (one per rank)."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    out = []
    for rank, ref in enumerate(refs):
        if not ray.wait([ref], timeout=0)[0]:
            continue
        try:
            ray.get(ref, timeout=0)
        except RayActorError as err:
            out.append(RankFailure(rank, True, f"{method}(): the actor died: {err}", err))
        except RayTaskError as err:
            cause = err.cause if err.cause is not None else err
            out.append(RankFailure(rank, False, f"{method}() raised {type(cause).__name__}: {cause}", err))
        except Exception as err:  # e.g. an object lost with its node
            out.append(RankFailure(rank, True, f"{method}(): {type(err).__name__}: {err}", err))
    return out


def failure_report(
    role: str,
    method: str,
    refs: list[Any],
    node_of: Callable[[int], str],
    node_id_of: Callable[[int], str | None],
    grace_s: float = PEER_GRACE_S,
) -> WorkerError | None:
    """The WorkerError for a call where some rank failed (None if none did): waits up to `grace_s` for
    the other ranks when every failure so far is a peer communication error, then names the cause first."""
    import ray

    failures = failures_of(refs, method)
    if not failures:
        return None
    if all(is_peer_error(f) for f in failures):
        pending = [r for r in refs if not ray.wait([r], timeout=0)[0]]
        nodes = {node_id_of(rank) for rank in range(len(refs))} - {None}
        deadline = time.monotonic() + grace_s
        while pending and time.monotonic() < deadline:
            left = deadline - time.monotonic()
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=max(0.0, min(1.0, left)))
            if any(not is_peer_error(f) for f in failures_of(refs, method)) or set(dead_nodes()) & nodes:
                break
        failures = failures_of(refs, method)
    dead = dead_nodes()
    suspects = {str(node_id_of(f.rank)) for f in failures if f.died and node_id_of(f.rank) is not None}
    dead.update(unreachable_nodes(suspects - set(dead)))
    lost_ranks = [r for r in range(len(refs)) if node_id_of(r) in dead]

    def priority(f: RankFailure) -> tuple[int, int]:
        return (0 if f.rank in lost_ranks else 1 if f.died else 2 if not is_peer_error(f) else 3, f.rank)

    failures.sort(key=priority)
    first = failures[0]
    cause = first.cause
    if lost_ranks:
        ids = sorted({str(node_id_of(r)) for r in lost_ranks})
        where = ", ".join(f"{dead[i]} (node {i[:8]})" for i in ids)
        cause = f"lost node {where} (dead, or its raylet does not answer); ranks on it: {lost_ranks}. {cause}"
        if first.rank not in lost_ranks:  # the lost rank has not reported yet: name it anyway
            first = RankFailure(lost_ranks[0], True, cause, first.error)
    others = [f for f in failures if f.rank != first.rank]
    if others:
        cause += "; then " + "; ".join(f"rank {f.rank} on {node_of(f.rank)}: {f.cause}" for f in others[:3])
        if len(others) > 3:
            cause += f"; and {len(others) - 3} more"
    error = WorkerError(role, first.rank, node_of(first.rank), cause)
    error.__cause__ = first.error
    return error
