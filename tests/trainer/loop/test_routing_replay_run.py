"""GRPO with routing replay (`actor.routing_replay=rollout`) on the tiny Qwen3-MoE through `RLTrainer`, as
`quartet train` runs it (in-process roles, `cluster.backend=local`): the engine records every token's
experts, the batch carries them, the old-log-prob, reference and update passes replay them, and each step
reports `moe/routing_mismatch`. The same through the agent loops and the replica's server (slow): the record
follows each trajectory's turns into the batch (docs/moe_routing_replay.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.trainer import RLTrainer

MULTI_TURN = [
    "rollout.interface=server",
    "rollout.multi_turn.enable=true",
    "rollout.multi_turn.default_agent=tool_agent",
    "rollout.multi_turn.tools=[calculator]",
    "rollout.multi_turn.max_assistant_turns=2",
    "data.max_response_length=24",
    "rollout.n=2",
]


def test_two_grpo_steps_replay_the_engines_routing(tmp_path: Path) -> None:
    run_two_steps(tmp_path, [])


@pytest.mark.slow  # ~12 s on a loaded 2-core machine; the batch test above is CI's end-to-end replay run
def test_two_grpo_steps_replay_through_the_agent_loops_and_the_server(tmp_path: Path) -> None:
    run_two_steps(tmp_path, MULTI_TURN)


def run_two_steps(tmp_path: Path, more: list[str]) -> None:
    """Two GRPO steps of the tiny MoE with replay; each reports the mismatch metric (the old-log-prob pass
    found the engine's record in the batch) and a gradient."""
    cfg = load_config(
        None,
        [
            "model.tiny.arch=qwen3_moe",
            "actor.routing_replay=rollout",
            "rollout.dtype=bfloat16",  # an engine whose routing differs from the float32 trainer's
            f"trainer.output_dir={tmp_path / 'out'}",
            "cluster.backend=local",
            "data.train_batch_size=4",
            "data.builtin_train_size=16",
            "data.max_response_length=8",
            "rollout.n=4",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=4",
            "actor.mixed_precision=float32",
            "actor.use_kl_loss=true",  # a reference role: its pass replays too
            "model.remove_padding=true",
            "trainer.total_steps=2",
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "trainer.loggers=[jsonl]",
            *more,
        ],
    )
    records: list[dict[str, Any]] = []
    result = RLTrainer(cfg, on_record=records.append).run()
    assert result.steps == 2
    steps = [r for r in records if r.get("kind") == "step"]
    assert len(steps) == 2
    for record in steps:
        metrics = record.get("metrics", record)
        share = metrics["moe/routing_mismatch"]
        assert 0.0 <= share <= 1.0
        assert metrics["actor/grad_norm"] > 0
