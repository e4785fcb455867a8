"""The doctor's dead-node warning on a real second raylet (`ray.cluster_utils.Cluster`) that is removed
while a run's rank lives on it. A subprocess, because the test process is already joined to the session's
Ray and one process can join only one cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    """
    import json, socket, time
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from quartet.cli.doctor_checks import dead_node_checks, run_checks
    from quartet.cluster.survey import survey

    @ray.remote(num_cpus=1)
    class Host:
        def ping(self):
            return 1

    with socket.socket() as sock:  # a free dashboard port: the session's Ray holds the default one
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    head = {"num_cpus": 1, "include_dashboard": True, "dashboard_port": port}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace="deadnode", log_to_driver=False)
    try:
        node_id = worker.node_id
        host = Host.options(
            name="dead-node-run-20260101-000000:rl:0",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote()
        ray.get(host.ping.remote(), timeout=120)
        cluster.remove_node(worker)
        deadline = time.monotonic() + 120  # hang guard: the GCS marks the node dead after its health checks
        while time.monotonic() < deadline and any(n["Alive"] for n in ray.nodes() if n["NodeID"] == node_id):
            time.sleep(1)
        while time.monotonic() < deadline:  # and the actor dead with it
            facts = survey(cluster.address)
            if all(a.state == "DEAD" for r in facts.runs for a in r.actors) and facts.runs:
                break
            time.sleep(1)
        checks = dead_node_checks(facts.nodes, facts.runs) + run_checks(facts.runs)
        print("RESULT", json.dumps({"node": node_id, "ip": worker.node_ip_address,
                                    "checks": [c.__dict__ for c in checks]}))
    finally:
        ray.shutdown()
        cluster.shutdown()
    """
)


def test_a_dead_node_is_named_with_the_ranks_that_ran_there() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=400)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(line.removeprefix("RESULT "))
    checks = {c["name"]: c for c in result["checks"]}
    node = checks[f"node {result['node']}"]
    assert node["status"] == "warn"
    assert node["message"] == (
        f"node {result['node']} ({result['ip']}) is dead; ranks there: dead-node-run-20260101-000000 rl:0"
    )
    run = checks["run deadnode/dead-node-run-20260101-000000"]
    assert run["status"] == "warn" and "rl:0 NODE_DIED" in run["message"]
