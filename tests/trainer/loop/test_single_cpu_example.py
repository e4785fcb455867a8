"""The single-CPU preset (examples/single_cpu) trains a few GRPO steps on a real local Ray, everything on
one bundle: one host actor holds the actor, the rollout engine and the reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quartet.cluster.naming import RunNames
from quartet.config import load_config
from quartet.trainer import RLTrainer

EXAMPLE = Path(__file__).parents[3] / "examples" / "single_cpu" / "config.yaml"
pytestmark = pytest.mark.ray


def test_single_cpu_example_trains_on_one_bundle(ray_cluster: None, tmp_path: Path) -> None:
    import ray
    from ray.util.state import list_actors

    address = ray.get_runtime_context().gcs_address  # this cluster, whatever else runs on the machine

    cfg = load_config(
        str(EXAMPLE),
        [
            f"trainer.output_dir={tmp_path}",
            "trainer.total_steps=2",
            "trainer.test_freq=0",
            "trainer.val_before_train=false",
            "trainer.loggers=[jsonl]",
            "data.builtin_train_size=64",
            "data.builtin_val_size=8",
            "data.train_batch_size=8",
            "actor.mini_batch_size=8",
            "cluster.cpus_per_bundle=1",
            "cluster.namespace=quartet-tests",  # the shared test cluster's namespace
        ],
    )
    assert cfg.cluster.world_size == 1 and cfg.actor.use_kl_loss  # the reference shares the bundle
    hosts_seen: list[list[str]] = []

    def during_step(rec: dict[str, Any]) -> None:
        if rec["kind"] == "step":
            names = RunNames.load(cfg.trainer.run_dir)
            alive = list_actors(address=address, filters=[("state", "=", "ALIVE")])
            hosts_seen.append([a.name for a in alive if (a.name or "").startswith(names.prefix)])

    result = RLTrainer(cfg, on_record=during_step).run()
    assert result.steps == 2
    assert len(hosts_seen) == 2 and all(len(h) == 1 for h in hosts_seen), hosts_seen  # one process
    assert "timing_s/ref" in result.last_metrics and "actor/kl_loss" in result.last_metrics
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    memory = next(r for r in records if r["kind"] == "memory")
    assert memory["memory/measured_peak_rss_bytes"] > memory["planned_peak_bytes"] > 0
