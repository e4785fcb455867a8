"""Finding a run's rollout servers from another process: explicit address, namespace and run prefix.

    urls = find_rollout_servers("auto", "quartet", "demo-20261124-101500", expected=2)
    # ['http://127.0.0.1:40123/v1', 'http://127.0.0.1:40517/v1']  (rank order)

This is the engine-side half of the "found 0 actors" story: an agent framework, an evaluation harness or a
second driver joins the cluster with the run's explicit address and namespace (`cluster.json` in the run
folder records them; `RunNames.load(run_dir)`), finds the hosts of the rollout role by name
(`<prefix>:<label>:<rank>`) and asks each for its server's URL. Short of `expected` hosts within
`timeout_s` it raises `WorkerDiscoveryError` saying what it looked for and where such actors do exist; a run
whose rollout has no HTTP server (rollout.interface=batch) is refused with that fix.
"""

from __future__ import annotations

from typing import Any

from quartet.cluster.discovery import find_workers
from quartet.cluster.errors import WorkerDiscoveryError

__all__ = ["find_rollout_servers"]


def find_rollout_servers(
    address: str,
    namespace: str,
    prefix: str,
    expected: int,
    label: str = "rl",
    timeout_s: float = 30.0,
) -> list[str]:
    """The base URLs of the run's rollout servers, one per rank (see the module docstring).

    label: the host set holding the rollout role (`rl`, the main pool of `quartet train`).
    """
    import ray

    hosts: list[Any] = find_workers(address, namespace, f"{prefix}:{label}", expected, timeout_s)
    urls = ray.get([h.call.remote("rollout", "server_url", (), {}) for h in hosts], timeout=timeout_s)
    if any(url is None for url in urls):
        raise WorkerDiscoveryError(
            f"found {len(hosts)} rollout worker(s) of run '{prefix}' in namespace '{namespace}', but their "
            "rollout has no HTTP server: the run was started with rollout.interface=batch. Fix: start it "
            "with rollout.interface=server"
        )
    return [str(url) for url in urls]
