"""The two agent examples end to end through `quartet train` (the SFT warm start, then 2 GRPO steps), shrunk
to seconds: the python-tool word problems (the real sandboxed tool) and the guessing game (the real
simulated user). Checked from the run's own files: the warm start trained and RL started from it, each
step logged the agent metrics, the rollout records show the conversation turn by turn with who wrote what
and the mask, and every record's score is the task's own verdict on that record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quartet.agents.interactions.guessing import INVALID, last_integer
from quartet.tasks import guessing, word_problems

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
SMALL = [
    "cluster.backend=local",
    "model.tiny.hidden_size=64",
    "model.tiny.intermediate_size=128",
    "model.tiny.num_hidden_layers=2",
    "data.builtin_train_size=64",
    "data.train_batch_size=2",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=4",
    "actor.logprobs.micro_batch_size_per_device=4",
    "trainer.total_steps=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.save_freq=0",
    "trainer.export_final=false",
    "trainer.rollout_freq=1",
    "trainer.loggers=[jsonl]",
    "sft.builtin.train_size=16",
    "sft.builtin.val_size=4",
    "sft.epochs=1",
    "sft.batch_size=8",
    "sft.micro_batch_size_per_device=8",
]


def _train(config: str, tmp_path: Path, extra: list[str]) -> tuple[Path, list[dict[str, Any]]]:
    quartet = Path(sys.executable).parent / "quartet"
    argv = [str(quartet), "train", str(ROOT / config), *SMALL, *extra]
    argv.append(f"trainer.output_dir={tmp_path}")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sft warm start trained: RL starts from" in proc.stdout
    runs = {p.parent.name: p.parent for p in tmp_path.rglob("metrics.jsonl")}
    (rl_name,) = [n for n in runs if not n.endswith("-sft_start")]
    assert f"{rl_name}-sft_start" in runs  # the warm start's own run folder
    steps = [json.loads(x) for x in (runs[rl_name] / "metrics.jsonl").read_text().splitlines()]
    return runs[rl_name], [s for s in steps if s.get("kind") == "step"]


def _records(run_dir: Path) -> list[dict[str, Any]]:
    files = sorted((run_dir / "rollouts").glob("step_*.jsonl"))
    assert len(files) == 2
    return [json.loads(x) for f in files for x in f.read_text().splitlines()]


def test_python_tool_word_problems_example(tmp_path: Path) -> None:
    run_dir, steps = _train("examples/agent_python/config.yaml", tmp_path, ["data.val_batch_size=4"])
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert 0.0 <= s["agent/success/mean"] <= 1.0 and s["tool/calls/total"] >= 0
    records = _records(run_dir)
    for rec in records:
        final = rec.get("final_message") or ""
        assert rec["score"] == word_problems.compute_score("", rec["ground_truth"], {"final_message": final})
        turns = rec.get("turns", [])
        assert all(t["mask"] == int(t["role"] == "assistant") for t in turns)
        assert {t["role"] for t in turns} <= {"assistant", "tool"}
    tool_turns = [t["text"] for rec in records for t in rec.get("turns", []) if t["role"] == "tool"]
    # the model's calls reached the real tool (what it answered: a status line, or an error for a bad call)
    assert all("exit status" in t or "Error:" in t or "killed" in t or "limit" in t for t in tool_turns)


def test_guessing_game_example_with_turn_rewards(tmp_path: Path) -> None:
    interactions = tmp_path / "interactions.yaml"
    interactions.write_text(
        "interactions:\n"
        "  - class: quartet.agents.interactions.guessing:GuessingGameInteraction\n"
        "    config: {consistent_guess_reward: 0.25}\n"
    )
    extra = [
        "data.val_batch_size=32",
        "rollout.multi_turn.interactions=[]",
        f"rollout.multi_turn.interaction_config_path={interactions}",
        "algorithm.turn_reward_coef=0.5",
        "rollout.multi_turn.step_deadline_s=300",
    ]
    run_dir, steps = _train("examples/agent_user/config.yaml", tmp_path, extra)
    assert [s["step"] for s in steps] == [1, 2]
    for s in steps:
        assert "agent/success/mean" in s and "critic/turn_advantages/abs_mean" in s
        assert s["agent/turn_reward/mean"] >= 0.0
    records = _records(run_dir)
    for rec in records:
        env = rec.get("env_reward")
        assert rec["score"] == guessing.compute_score("", rec["ground_truth"], {"env_reward": env})
        turns = rec.get("turns", [])
        assert {t["role"] for t in turns} <= {"assistant", "user"}
        target, low, high = int(rec["ground_truth"]), 1, 32
        for guess, reply in zip(turns, turns[1:], strict=False):  # the user answered each guess rightly
            if guess["role"] == "assistant" and reply["role"] == "user":
                value = last_integer(guess["text"].replace("<|im_end|>", ""))
                if value is None:
                    want = INVALID
                else:  # the task's user names the range still open after the guess (narrowed here)
                    low, high = (max(low, value + 1), high) if value < target else (low, min(high, value - 1))
                    direction = "Higher." if value < target else "Lower."
                    want = f"{direction} It is from {low} to {high}."
                assert f"user\n{want}<|im_end|>" in reply["text"]
        assert all(t["mask"] == int(t["role"] == "assistant") for t in turns)
        # a model turn's reward is the user's: 0.25 for a guess inside the range still open, else 0
        assert all(t["turn_reward"] in (0.0, 0.25) for t in turns if t["role"] == "assistant")
