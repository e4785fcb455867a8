"""The host name a server puts in its URL: one that other machines can reach.

A server bound to a wildcard (`0.0.0.0`, `::`) listens on every interface, but a URL naming the wildcard
points every client at its OWN machine. The URL names this node's address instead: the one Ray uses for
it inside a Ray worker (what the other nodes already reach), else the address of the interface that routes
outwards. A specific bind address (`127.0.0.1`, a LAN IP) is the URL's host as it is: loopback servers are
reachable from this machine only, by choice (`rollout.server.host`).
"""

from __future__ import annotations

import logging
import socket

__all__ = ["WILDCARDS", "advertised_host", "node_ip"]

log = logging.getLogger(__name__)
WILDCARDS = ("0.0.0.0", "::", "")


def node_ip() -> str:
    """This node's address as the cluster sees it: Ray's node IP inside Ray, else the outward interface's."""
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    except Exception as err:  # no Ray, or not connected: the socket lookup below
        log.debug("no Ray node address: %s", err)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET address: picks the routing interface, sends nothing
            return str(probe.getsockname()[0])
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def advertised_host(bind_host: str) -> str:
    """The host for a server's URL: `bind_host` unless it is a wildcard, then this node's address."""
    return node_ip() if bind_host in WILDCARDS else bind_host
