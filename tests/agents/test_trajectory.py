"""Token-exact multi-turn bookkeeping with the tiny model's real tokenizer and ChatML template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from quartet.agents.batch import trajectories_to_batch, trajectory_metrics
from quartet.agents.trajectory import ChatRenderer, Trajectory, token_drift
from quartet.core.batch import Batch

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> object:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _two_turns(tokenizer: object) -> tuple[ChatRenderer, Trajectory, list[list[int]]]:
    renderer = ChatRenderer(tokenizer)
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    traj = Trajectory(renderer.prompt_ids(messages), list(messages))
    first = renderer.encode(CALL + "<|im_end|>")  # what a model would sample, end-of-turn included
    traj.add_model_turn(first, [-0.5] * len(first))
    traj.messages.append({"role": "assistant", "content": CALL})
    tool = [{"role": "tool", "content": "391"}]
    env = renderer.env_turn_ids(tool)
    traj.add_env_turn("tool", env)
    traj.messages += tool
    second = renderer.encode("The answer is 391.<|im_end|>")
    traj.add_model_turn(second, [-0.25] * len(second))
    traj.messages.append({"role": "assistant", "content": "The answer is 391."})
    return renderer, traj, [first, env, second]


def test_separator_and_env_turn_follow_the_template(tokenizer: object) -> None:
    renderer = ChatRenderer(tokenizer)
    assert renderer.separator == "\n"  # ChatML: <|im_end|> then a newline
    env = renderer.env_turn_ids([{"role": "tool", "content": "391"}])
    assert tokenizer.decode(env) == "\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\n"


def test_masks_ids_and_zero_drift_for_a_round_tripping_template(tokenizer: object) -> None:
    renderer, traj, pieces = _two_turns(tokenizer)
    first, env, second = pieces
    assert traj.response_ids == first + env + second  # turns in order, each tokenized once
    assert traj.response_mask == [1] * len(first) + [0] * len(env) + [1] * len(second)
    assert traj.logprobs == [-0.5] * len(first) + [0.0] * len(env) + [-0.25] * len(second)
    assert [(t.role, t.stop - t.start) for t in traj.turns] == [
        ("assistant", len(first)),
        ("tool", len(env)),
        ("assistant", len(second)),
    ]
    # the one-shot rendering of the whole conversation is the same ids, token for token
    whole = renderer.encode(renderer.render(traj.messages))
    assert traj.prompt_ids + traj.response_ids + renderer.encode("\n") == whole
    assert token_drift(renderer, traj) == 0


def test_drift_counts_a_non_canonical_tokenization(tokenizer: object) -> None:
    renderer, traj, _ = _two_turns(tokenizer)
    # the model spelled "391" digit by digit differently from how the text re-tokenizes: simulate with an
    # extra token the re-render does not have
    traj.response_ids.insert(len(traj.response_ids) - 1, renderer.encode(" ")[0])
    traj.response_mask.insert(len(traj.response_mask) - 1, 1)
    assert token_drift(renderer, traj) > 0


def test_drift_of_a_truncated_trajectory_counts_only_the_ids_it_has(tokenizer: object) -> None:
    renderer, traj, (first, env, _) = _two_turns(tokenizer)
    traj.truncate(len(first) + 3)  # cut inside the tool turn, as the trainer's response width would
    assert traj.truncated and len(traj.response_ids) == len(first) + 3
    assert token_drift(renderer, traj) == 0  # the cut-off rest is not a mismatch
    traj.response_ids[len(first) + 1] = renderer.encode("7")[0]  # a wrong token inside what remains
    assert token_drift(renderer, traj) == 1


def test_drift_of_a_turn_stopped_before_its_end_of_turn_token(tokenizer: object) -> None:
    renderer = ChatRenderer(tokenizer)
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    traj = Trajectory(renderer.prompt_ids(messages), list(messages))
    cut = renderer.encode("The answer is")  # the token budget ran out mid-turn: no <|im_end|>
    traj.add_model_turn(cut, [-0.1] * len(cut))
    traj.messages.append({"role": "assistant", "content": "The answer is"})
    assert token_drift(renderer, traj) == 0


def test_trajectories_to_batch_layout(tokenizer: object) -> None:
    renderer, traj, _ = _two_turns(tokenizer)
    short = Trajectory(renderer.prompt_ids([{"role": "user", "content": "hi"}]), [])
    ok = renderer.encode("ok<|im_end|>")
    short.add_model_turn(ok, [-1.0] * len(ok))
    traj.finish_reason, short.finish_reason = "no_tool_call", "no_tool_call"
    prompts = Batch(
        {"prompts": torch.zeros(2, 3, dtype=torch.int64), "attention_mask": torch.ones(2, 3)},
        {"data_source": ["a", "b"]},
        batch_size=2,
    )
    batch = trajectories_to_batch(prompts, [traj, short], n=1, pad_token_id=0, response_width=128)
    p = batch["prompts"].shape[1]
    assert p == max(len(traj.prompt_ids), len(short.prompt_ids))
    for row, t in enumerate([traj, short]):
        mask = batch["attention_mask"][row]
        assert batch["prompts"][row][mask[:p] != 0].tolist() == t.prompt_ids
        m = len(t.response_ids)
        assert batch["responses"][row, :m].tolist() == t.response_ids
        assert batch["response_mask"][row].tolist() == t.response_mask + [0] * (128 - m)
        assert int(mask[p:].sum()) == m  # env tokens are attended to, only model tokens are trained
    assert list(batch.non_tensors["data_source"]) == ["a", "b"]
    metrics = trajectory_metrics([traj, short])
    assert metrics["agent/finish/no_tool_call"] == 1.0
    model_tokens = [sum(traj.response_mask) / 2, sum(short.response_mask) / 1]
    assert metrics["agent/tokens_per_turn/mean"] == pytest.approx(sum(model_tokens) / 2)
    assert json.dumps(metrics)  # plain floats
