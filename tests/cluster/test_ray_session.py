"""`connect_while_importing`: Ray's start on the main thread overlapped with the trainer's imports; either
failure reaches the caller, the connect's first, and nothing is left half-done."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_connect import closed_port

from quartet.cluster.ray_session import connect_while_importing, take_early_connect_seconds
from quartet.config.cluster import ClusterConfig

FAILED_CONNECT = """
import sys
from quartet.cluster.ray_session import connect_while_importing, take_early_connect_seconds
from quartet.config.cluster import ClusterConfig
try:
    connect_while_importing(ClusterConfig(address=sys.argv[1], connect_timeout_s=2.0), ["no_such_module_q"])
except Exception as err:
    import ray
    print(type(err).__name__, take_early_connect_seconds(), ray.is_initialized(), err)
"""


def test_a_failed_connect_is_raised_after_the_imports_and_starts_nothing() -> None:
    """In a fresh process (this one may hold the session's Ray): the connect's error wins over the
    import's, no connect time is reported, and no Ray is left running."""
    address = closed_port()
    done = subprocess.run(
        [sys.executable, "-c", FAILED_CONNECT, address], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    kind, seconds, connected, message = done.stdout.strip().split(" ", 3)
    assert (kind, float(seconds), connected) == ("RayConnectError", 0.0, "False")
    assert address in message


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
