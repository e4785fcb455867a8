"""The rollout role in multi-turn with its HTTP server (`rollout.interface=server`), on one local rank with
the real tiny model: its server answers the official OpenAI client, agent-loop trajectories come back as the
trainer's rollout rows, and the server refuses requests while the role sleeps (a training step) and serves
again after it wakes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from quartet.agents.runner import trajectory_seed
from quartet.config import QuartetConfig, load_config
from quartet.data.prompts import PromptDataset
from quartet.models.loading import load_tokenizer
from quartet.roles.rollout import Rollout
from quartet.roles.rollout.generators import AgentLoopGenerator
from quartet.rollout.types import GenerationRequest
from quartet.tasks.rows import rl_row
from quartet.trainer.workers.start import run_values

API_KEY = "test-key"
OVERRIDES = [
    "data.max_prompt_length=192",
    "data.max_response_length=24",
    "rollout.n=2",
    "rollout.multi_turn.enable=true",
    "rollout.multi_turn.tools=[calculator]",
    "rollout.multi_turn.max_assistant_turns=3",
    f"rollout.server.api_key={API_KEY}",
]


def config(interface: str) -> QuartetConfig:
    return load_config(None, [*OVERRIDES, f"rollout.interface={interface}"], check=False)


def prompt_rows(cfg: QuartetConfig, model_dir: Path, role: Rollout) -> Any:
    assert isinstance(role.generator, AgentLoopGenerator)
    schemas = [tool.schema for tool in role.generator.runner.env.tools.values()]
    rows = [
        rl_row(
            [{"role": "user", "content": f"What is {a} * 7 + 1?"}],
            "calculator",
            str(a * 7 + 1),
            index=i,
            split="t",
        )
        for i, a in enumerate((123, 456))
    ]
    data = PromptDataset.from_rows(rows, cfg.data, load_tokenizer(model_dir), "rows", tools=schemas)
    return data.batch([0, 1]).with_meta(global_step=3)


@pytest.mark.usefixtures("one_local_rank")
def test_server_rollout_serves_openai_and_runs_agent_loops(tiny_model_dir: Path) -> None:
    cfg = config("server")
    role = Rollout(cfg.rollout, run_values(cfg, str(tiny_model_dir)))
    try:
        url = role.server_url()
        assert url is not None and url.startswith("http://127.0.0.1:")
        client = openai.OpenAI(base_url=url, api_key=API_KEY, max_retries=0, timeout=60)
        chat = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 2+2?"}], max_tokens=5, seed=1
        )
        assert chat.usage is not None and 1 <= chat.usage.completion_tokens <= 5
        assert isinstance(chat.choices[0].message.content, str)

        prompts = prompt_rows(cfg, tiny_model_dir, role)
        batch = role.generate(prompts)
        assert len(batch) == 4 and batch["responses"].shape[1] == 24
        p = batch["prompts"].shape[1]
        for row in range(4):
            mask, attn = batch["response_mask"][row], batch["attention_mask"][row, p:]
            assert torch.all(attn[mask == 1] == 1)  # model tokens are real tokens
            assert int(mask.sum()) >= 1
            assert batch.non_tensors["extra_info"][row]["num_turns"] >= 1
            assert "agent/token_drift" in batch.non_tensors["agent_metrics"][row]
        # the first model turn is exactly what the engine samples for that prompt with the trajectory's seed
        sampling = role._sampling(prompts)
        first_turn = batch["response_mask"][0].tolist()
        k = first_turn.index(0) if 0 in first_turn else len(first_turn)
        prompt_ids = batch["prompts"][0][batch["attention_mask"][0, :p] == 1].tolist()
        params = dataclasses.replace(
            sampling, n=1, seed=trajectory_seed(sampling.seed or 0, 0, 0, 2, 0), max_new_tokens=24
        )
        alone = role.engine.generate([GenerationRequest(tuple(prompt_ids), params)])[0][0]
        assert batch["responses"][0][:k].tolist() == list(alone.token_ids)

        role.sleep()  # a training step: the server refuses, with the reason
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        assert refused.value.status_code == 503 and "asleep" in str(refused.value)
        role.wake()
        again = client.completions.create(model="policy", prompt="What is", max_tokens=3)
        assert again.usage is not None and again.usage.completion_tokens >= 1
    finally:
        role.shutdown()


@pytest.mark.usefixtures("one_local_rank")
def test_batch_interface_runs_agent_loops_without_http(tiny_model_dir: Path) -> None:
    cfg = config("batch")
    role = Rollout(cfg.rollout, run_values(cfg, str(tiny_model_dir)))
    try:
        assert role.server_url() is None
        batch = role.generate(prompt_rows(cfg, tiny_model_dir, role))
        assert len(batch) == 4 and "agent_metrics" in batch.non_tensors
        role.sleep()
        role.wake()
        assert len(role.generate(prompt_rows(cfg, tiny_model_dir, role))) == 4
    finally:
        role.shutdown()
