"""Discovery from a separate process by (address, namespace, prefix), and its explained failure."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import roles_for_tests
from ray import cloudpickle
from roles_for_tests import Counter

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool

cloudpickle.register_pickle_by_value(roles_for_tests)
pytestmark = pytest.mark.ray

FINDER = textwrap.dedent(
    """
    import sys
    from quartet.cluster.discovery import find_workers
    from quartet.cluster.errors import WorkerDiscoveryError
    address, namespace, prefix, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    try:
        handles = find_workers(address, namespace, prefix, expected, timeout_s=3)
    except WorkerDiscoveryError as err:
        print("DISCOVERY-ERROR", err)
        sys.exit(3)
    import ray
    print("FOUND", [ray.get(h.ping.remote(), timeout=30) for h in handles])
    """
)


def _find(address: str, namespace: str, prefix: str, expected: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", FINDER, address, namespace, prefix, str(expected)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_other_process_finds_workers_or_is_told_where_they_are(ray_cluster: None) -> None:
    import ray

    names = RunNames("quartet-tests", "discovery-run")
    pool = ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=30).create()
    hosts = colocate(pool, names, counter=RoleSpec(Counter, 0))
    address = ray.get_runtime_context().gcs_address
    try:
        pids = hosts.health()
        ok = _find(address, "quartet-tests", names.prefix, 2)
        assert ok.returncode == 0, ok.stderr[-2000:]
        assert f"FOUND {pids}" in ok.stdout  # the same two processes, in rank order

        wrong = _find(address, "quartet", names.prefix, 2)
        assert wrong.returncode == 3, wrong.stderr[-2000:]
        assert "found 0 of 2 workers" in wrong.stdout
        assert "namespace 'quartet'" in wrong.stdout
        assert "exist in namespace(s): 'quartet-tests'" in wrong.stdout  # where the actors really are
        assert address in wrong.stdout

        short = _find(address, "quartet-tests", names.prefix, 3)
        assert short.returncode == 3 and "found 2 of 3" in short.stdout
    finally:
        hosts.shutdown()
