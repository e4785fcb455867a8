"""Routing record and replay are checked at config time: an MoE model, the built-in engine, whole rows per
rank; replay implies the record (the plan says so to the rollout role). The server and the agent loops carry
the record, so they are accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quartet.config import ConfigError, load_config, plan_step

MOE = "model.tiny.arch=qwen3_moe"
REPLAY = "actor.routing_replay=rollout"


def _problem(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=list(overrides))
    return info.value


def test_replay_implies_the_record_and_is_off_by_default() -> None:
    plain = plan_step(load_config(overrides=[MOE]))
    assert not plain.record_routing and not plain.routing_replay
    replay = plan_step(load_config(overrides=[MOE, REPLAY]))
    assert replay.record_routing and replay.routing_replay
    record = plan_step(load_config(overrides=[MOE, "rollout.record_routing=true"]))
    assert record.record_routing and not record.routing_replay


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ((REPLAY,), ("actor.routing_replay", "model.tiny.arch=qwen2", "not a mixture-of-experts")),
        (("rollout.record_routing=true",), ("rollout.record_routing", "not a mixture-of-experts")),
        ((MOE, REPLAY, "rollout.engine=vllm"), ("rollout.engine=vllm", "rollout.engine=torch")),
        (
            (MOE, REPLAY, "model.sequence_parallel_size=2", "cluster.bundles_per_node=2"),
            ("model.sequence_parallel_size=2", "would cut them", "model.sequence_parallel_size=1"),
        ),
    ],
    ids=["dense-replay", "dense-record", "vllm", "sequence-parallel"],
)
def test_what_cannot_record_or_replay_is_named(overrides: tuple[str, ...], names: tuple[str, ...]) -> None:
    message = str(_problem(*overrides))
    for name in names:
        assert name in message


@pytest.mark.parametrize(
    "overrides",
    [("rollout.interface=server",), ("rollout.multi_turn.enable=true",)]
    + [("rollout.interface=server", "rollout.multi_turn.enable=true")],
    ids=["server", "multi-turn", "both"],
)
def test_the_server_and_the_agent_loops_carry_the_record(overrides: tuple[str, ...]) -> None:
    plan = plan_step(load_config(overrides=[MOE, REPLAY, *overrides]))
    assert plan.record_routing and plan.routing_replay


def test_a_model_folder_is_read_for_its_experts(tmp_path: Path) -> None:
    dense, moe = tmp_path / "dense", tmp_path / "moe"
    for folder, config in (
        (dense, {"model_type": "qwen2"}),
        (moe, {"model_type": "qwen3_moe", "num_experts": 8}),
    ):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    assert "not a mixture-of-experts" in str(_problem(f"model.path={dense}", REPLAY))
    load_config(overrides=[f"model.path={moe}", REPLAY])
