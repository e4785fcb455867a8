"""A resource pool over two nodes (`ray.cluster_utils.Cluster`: two raylets on this machine).

It runs in a subprocess because the session's Ray is already connected in the test process, and one
process can join only one cluster.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import ray
    from ray import cloudpickle
    from ray.cluster_utils import Cluster
    import roles_for_tests
    from roles_for_tests import AllReducer
    from quartet.cluster.colocate import RoleSpec, colocate
    from quartet.cluster.naming import RunNames
    from quartet.cluster.pool import ResourcePool

    cloudpickle.register_pickle_by_value(roles_for_tests)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="multinode", log_to_driver=False)
    try:
        nodes = sorted((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])
        pool = ResourcePool(2, 2, 0.5, use_gpu=False, timeout_s=60).create()
        first = [s.node_id for s in pool.slots]
        hosts = colocate(pool, RunNames("multinode", "mn"), reducer=RoleSpec(AllReducer))
        placed = [info["node_id"] for info in hosts.nodes]
        reduced = hosts.groups["reducer"].all_reduce(1.0)
        hosts.shutdown()
        again = ResourcePool(2, 2, 0.5, use_gpu=False, timeout_s=60).create()
        second = [s.node_id for s in again.slots]
        again.remove()
        print("RESULT", json.dumps({"nodes": [n for _, n in nodes], "first": first, "placed": placed,
                                    "second": second, "reduced": reduced}))
    finally:
        ray.shutdown()
        cluster.shutdown()
    """
)


def test_pool_spans_two_nodes_in_a_deterministic_rank_order() -> None:
    here = Path(__file__).parent
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(here)], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-4000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    a, b = result["nodes"]  # sorted by (ip, node id): the order ranks must follow
    assert a != b
    assert result["first"] == [a, a, b, b]  # ranks 0-1 on the first node, 2-3 on the second
    assert result["placed"] == result["first"]  # each host actor really runs on its rank's node
    assert result["second"] == result["first"]  # a second pool on the same cluster: same ranks
    assert result["reduced"] == [10.0] * 4  # gloo across both nodes: 1 + 2 + 3 + 4
