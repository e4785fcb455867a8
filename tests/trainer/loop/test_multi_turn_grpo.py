"""Multi-turn GRPO end to end on one bundle: a tiny model gets a short SFT warm start on calculator traces,
then GRPO steps run the tool loop (actor, rollout and reference colocated, local backend, one process).

Checked from the outside: the rollout called the real calculator, tool turns are masked out of the loss
(rollout records show tool turns between model turns), the agent metrics are logged, the actor's weights
moved, and every record's score agrees with the task's verifier applied to the record's own final turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.sft import SFTTrainer
from quartet.tasks.calculator import verify_answer
from quartet.trainer import RLTrainer

pytestmark = pytest.mark.slow

MAX_RESPONSE = 80  # tokens of the whole conversation after the prompt

COMMON = [
    "cluster.backend=local",  # SFT and GRPO in this process: no Ray, whatever the session has started
    "model.tiny.hidden_size=64",
    "model.tiny.intermediate_size=128",
    "model.tiny.num_hidden_layers=2",
    "data.builtin_task=calculator",
    "data.builtin_digits=2",
    "data.builtin_train_size=64",
    "data.builtin_val_size=8",
    "data.max_prompt_length=176",
    f"data.max_response_length={MAX_RESPONSE}",
    "sft.builtin.task=calculator",
    "sft.builtin.digits=2",
    "sft.builtin.train_size=64",
    "sft.builtin.val_size=8",
    "sft.max_length=320",
    "sft.epochs=40",
    "sft.batch_size=16",
    "sft.micro_batch_size_per_device=16",
    "sft.eval_samples=0",
    "sft.optim.lr=3e-3",
]
RL = [
    "cluster.backend=local",
    "rollout.multi_turn.enable=true",
    "rollout.multi_turn.tools=[calculator]",
    "rollout.multi_turn.max_assistant_turns=2",
    "rollout.n=4",
    "data.train_batch_size=4",
    "actor.use_kl_loss=true",  # needs the reference: actor, rollout and reference share the one bundle
    "actor.mini_batch_size=4",
    "actor.micro_batch_size_per_device=16",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-4",
    "trainer.total_steps=2",
    "trainer.test_freq=2",
    "trainer.rollout_freq=1",
    "trainer.rollout_samples=16",
]


def test_multi_turn_grpo_on_one_bundle(tmp_path: Path) -> None:
    base = [*COMMON, f"trainer.output_dir={tmp_path}"]
    sft = SFTTrainer(load_config(None, [*base, "trainer.experiment_name=sft"])).run()
    cfg = load_config(None, [*base, *RL, f"model.path={sft.hf_dir}", "trainer.experiment_name=grpo"])
    records: list[dict[str, Any]] = []
    result = RLTrainer(cfg, on_record=records.append).run()
    assert result.steps == 2

    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 2
    for m in steps:
        for key in (
            "agent/assistant_turns/mean",
            "agent/tokens_per_turn/mean",
            "agent/token_drift/mean",
            "tool/calls/total",
            "tool/failed/total",
            "tool/latency_s/max",
            "actor/pg_loss",
            "actor/kl_loss",
            "timing_s/ref",
        ):
            assert key in m, f"missing {key}"
        # a barely trained tiny model samples stray byte tokens (half a UTF-8 character) that do not survive
        # decode + re-encode: the drift check must see those, so it is a count here, not zero (zero for
        # canonical model text is tests/agents/test_trajectory.py's and test_agent_runner.py's job)
        assert 0 <= m["agent/token_drift/mean"] <= m["agent/token_drift/max"]
    # the warm-started model calls the tool: the loop ran real calculator calls
    assert sum(m["tool/calls/total"] for m in steps) > 0
    assert max(m["agent/assistant_turns/mean"] for m in steps) > 1
    val = [r for r in records if r["kind"] == "val"]
    assert "val-core/calculator/reward/mean@1" in val[-1] and "val-aux/tool/calls/total" in val[-1]

    rollouts = [
        json.loads(x) for x in (result.run_dir / "rollouts" / "step_1.jsonl").read_text().splitlines()
    ]
    multi = [r for r in rollouts if any(t["role"] == "tool" for t in r.get("turns", []))]
    assert multi, "no multi-turn record: the tool loop never appended a tool turn"
    header = "\n<|im_start|>tool\n"  # the template's separator, then the tool turn
    for rec in multi:
        turns = rec["turns"]
        assert turns[0]["role"] == "assistant" and {t["role"] for t in turns} == {"assistant", "tool"}
        assert all(t["mask"] == int(t["role"] == "assistant") for t in turns)  # only the model's in the loss
        assert sum(t["tokens"] for t in turns) == rec["response_tokens"]
        for at, turn in enumerate(turns):
            if turn["role"] != "tool":
                continue
            if at + 1 < len(turns):  # a whole tool turn: the next assistant header closes it
                assert turn["text"].startswith(header), turn
                assert (
                    turn["text"].rstrip().endswith("<|im_start|>assistant")
                    and turns[at + 1]["role"] == "assistant"
                )
            else:  # the last turn may be cut by the response width (sampling decides where): only a prefix
                cut = rec["response_tokens"] == MAX_RESPONSE
                assert turn["text"].startswith(header) or (cut and header.startswith(turn["text"])), (
                    turn,
                    rec,
                )
    for rec in rollouts:  # every score is the verifier's verdict on the record's own final turn
        assert rec["num_turns"] >= 1
        assert rec["score"] == float(verify_answer(rec["final_message"], rec["ground_truth"]))
