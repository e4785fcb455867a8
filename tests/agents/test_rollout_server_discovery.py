"""A second OS process (not a Ray actor) finds a run's rollout servers by address + namespace + prefix and
chats with them through the official OpenAI client; with a wrong namespace it gets the explained discovery
error (where the run's actors really are), never "0 actors"."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.config import load_config
from quartet.roles.rollout import Rollout
from quartet.trainer.workers.start import run_values

pytestmark = pytest.mark.ray

CLIENT = textwrap.dedent(
    """
    import json, sys
    import openai
    from quartet.cluster.errors import WorkerDiscoveryError
    from quartet.serving.discovery import find_rollout_servers
    address, namespace, prefix, expected = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    try:
        urls = find_rollout_servers(address, namespace, prefix, expected, timeout_s=3)
    except WorkerDiscoveryError as err:
        print("DISCOVERY-ERROR", err)
        sys.exit(3)
    answers = []
    for url in urls:
        client = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=60)
        chat = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 1+1?"}], max_tokens=4
        )
        answers.append({"url": url, "tokens": chat.usage.completion_tokens, "model": chat.model})
    print("ANSWERS", json.dumps(answers))
    """
)


def _client(address: str, namespace: str, prefix: str, expected: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CLIENT, address, namespace, prefix, str(expected)],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_second_process_finds_rollout_servers_or_is_told_why(ray_cluster: None, tiny_model_dir: Path) -> None:
    import ray

    cfg = load_config(
        None,
        ["rollout.interface=server", "rollout.server.api_key=k", "data.max_response_length=8"],
        check=False,
    )
    names = RunNames("quartet-tests", "async-rollout")
    pool = ResourcePool(1, 2, 0.5, use_gpu=False, timeout_s=60).create()
    hosts = colocate(
        pool, names, label="rl", rollout=RoleSpec(Rollout, cfg.rollout, run_values(cfg, str(tiny_model_dir)))
    )
    address = ray.get_runtime_context().gcs_address
    try:
        urls = hosts.groups["rollout"].server_url()
        assert len(urls) == 2 and len(set(urls)) == 2  # one server per replica

        found = _client(address, "quartet-tests", names.prefix, 2)
        assert found.returncode == 0, found.stderr[-3000:]
        answers = json.loads(found.stdout.split("ANSWERS", 1)[1])
        assert [a["url"] for a in answers] == urls  # the same servers, in rank order
        assert all(1 <= a["tokens"] <= 4 and a["model"] == "policy" for a in answers)

        wrong = _client(address, "quartet", names.prefix, 2)
        assert wrong.returncode == 3, wrong.stderr[-3000:]
        assert "found 0 of 2 workers" in wrong.stdout and "namespace 'quartet'" in wrong.stdout
        assert "exist in namespace(s): 'quartet-tests'" in wrong.stdout
    finally:
        hosts.shutdown()
