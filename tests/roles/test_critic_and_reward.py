"""Critic (values, clipped value updates) and reward model (scores, re-encoding) on the local backend."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from role_cases import local, rl_batch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from quartet.cluster.colocate import RoleSpec
from quartet.config import CriticConfig, Dtype, RewardConfig
from quartet.core.batch import Batch
from quartet.roles.critic import Critic
from quartet.roles.reward_model import RewardModel
from quartet.roles.run_values import RunValues


@pytest.fixture(autouse=True)
def _restore_env(one_local_rank: None) -> None:
    """Local hosts set RANK/WORLD_SIZE/MASTER_* in this process; restore them after each test."""


def test_critic_value_loss_decreases_on_a_fixed_batch(
    critic_config: CriticConfig, run_values: RunValues
) -> None:
    hosts = local(critic=RoleSpec(Critic, critic_config, run_values))
    try:
        critic = hosts.groups["critic"]
        batch = rl_batch(8, seed=2)
        values = critic.compute_values(batch)["values"]
        assert values.shape == batch["responses"].shape
        assert bool((values[batch["response_mask"] == 0] == 0).all())  # nothing past a response's end
        targets = torch.linspace(-1.0, 1.0, values.numel()).reshape(values.shape) * batch["response_mask"]
        losses = []
        for _ in range(6):
            old = critic.compute_values(batch)["values"]
            step = batch.union(Batch({"values": old, "returns": targets}))
            (metrics,) = critic.update(step)
            losses.append(metrics["critic/vf_loss"])
        assert losses[-1] < 0.7 * losses[0], losses
        assert 0.0 <= metrics["critic/vf_clipfrac"] <= 1.0
    finally:
        hosts.shutdown()


def _reward_model_folder(tiny_model_dir: Path, folder: Path, chat_template: str | None = None) -> Path:
    """A one-label sequence classifier started from the tiny causal LM (random head), with a tokenizer."""
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model.config.pad_token_id = tokenizer.pad_token_id
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _score_alone(folder: Path, ids: torch.Tensor) -> float:
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        return float(model(input_ids=ids.unsqueeze(0)).logits[0, 0])


def test_reward_model_scores_the_last_valid_token(
    run_values: RunValues, tiny_model_dir: Path, tmp_path: Path
) -> None:
    folder = _reward_model_folder(tiny_model_dir, tmp_path / "rm")
    hosts = local(rm=RoleSpec(RewardModel, RewardConfig(model_path=str(folder)), run_values, Dtype.FLOAT32))
    try:
        batch = rl_batch(6, seed=3)
        scores = hosts.groups["rm"].score(batch)["rm_scores"]
        assert scores.shape == (6,) and bool(torch.isfinite(scores).all())
        for i in range(6):
            keep = batch["attention_mask"][i] > 0
            ids = torch.cat([batch["prompts"][i], batch["responses"][i]])[keep]
            assert float(scores[i]) == pytest.approx(_score_alone(folder, ids), abs=1e-4)
    finally:
        hosts.shutdown()


def test_reward_model_with_another_chat_template_reencodes(
    run_values: RunValues, tiny_model_dir: Path, tmp_path: Path
) -> None:
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    folder = _reward_model_folder(tiny_model_dir, tmp_path / "rm2", chat_template=template)
    hosts = local(rm=RoleSpec(RewardModel, RewardConfig(model_path=str(folder)), run_values, Dtype.FLOAT32))
    try:
        tok = AutoTokenizer.from_pretrained(tiny_model_dir)
        prompt = tok("What is 2+3?", add_special_tokens=False)["input_ids"]
        reply = tok("5", add_special_tokens=False)["input_ids"]
        batch = Batch(
            {
                "prompts": torch.tensor([prompt]),
                "responses": torch.tensor([reply + [tok.pad_token_id]]),
                "attention_mask": torch.tensor([[1] * len(prompt) + [1] * len(reply) + [0]]),
                "response_mask": torch.tensor([[1] * len(reply) + [0]]),
            },
            {"raw_prompt": [[{"role": "user", "content": "What is 2+3?"}]]},
        )
        (score,) = hosts.groups["rm"].score(batch)["rm_scores"].tolist()
        text = "[user] What is 2+3?\n[assistant] 5\n"
        expected = _score_alone(folder, torch.tensor(tok(text, add_special_tokens=False)["input_ids"]))
        assert score == pytest.approx(expected, abs=1e-4)
    finally:
        hosts.shutdown()
