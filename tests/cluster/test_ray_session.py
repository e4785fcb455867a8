"""`connect_while_importing`: Ray's start on the main thread overlapped with the trainer's imports; either
failure reaches the caller, the connect's first, and nothing is left half-done."""

from __future__ import annotations

import sys

import pytest
from test_connect import closed_port

from quartet.cluster.connect import RayConnectError
from quartet.cluster.ray_session import connect_while_importing, take_early_connect_seconds
from quartet.config.cluster import ClusterConfig


def test_a_failed_connect_is_raised_after_the_imports_and_starts_nothing() -> None:
    address = closed_port()
    was_connected = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    with pytest.raises(RayConnectError, match=address.split(":")[1]):
        connect_while_importing(
            ClusterConfig(address=address, connect_timeout_s=2.0), ["quartet_no_such_module_here"]
        )
    assert take_early_connect_seconds() == 0.0  # no connect to report
    assert was_connected or not sys.modules["ray"].is_initialized()


@pytest.mark.ray
@pytest.mark.usefixtures("ray_cluster")
def test_an_import_failure_is_raised_once_the_connect_is_done() -> None:
    cfg = ClusterConfig(namespace="quartet-tests")  # the session's Ray: connect keeps it
    connect_while_importing(cfg, ["json", "quartet.config"])
    assert take_early_connect_seconds() > 0.0
    assert take_early_connect_seconds() == 0.0  # reported once, by the first launch after it
    with pytest.raises(ModuleNotFoundError, match="quartet_no_such_module_here"):
        connect_while_importing(cfg, ["quartet_no_such_module_here"])
    wrong = ClusterConfig(namespace="elsewhere")
    with pytest.raises(RuntimeError, match="namespace 'quartet-tests'"):
        connect_while_importing(wrong, ["json"])
