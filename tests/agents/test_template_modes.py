"""The template modes in the agent loop, with a scripted policy (fixed token ids) so the template logic is
what is under test: a guessing game whose model turns reason in `<think>` blocks, on the Qwen3-like test
template (drops the reasoning of turns before the last user message) and on a well-behaved one.

keep_history_tokens: the ids are the engine's tokens plus the environment's messages rendered as ChatML
deltas, computed here from the template's format by hand; the mask covers exactly the model's tokens.
rerender: every prompt is the template's rendering of the messages; the turns whose rendering dropped
reasoning are counted, and the tokens the engine did not sample in that context leave the loss.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from template_cases import QWEN3_LIKE, WELL_BEHAVED, save_with_template
from transformers import AutoTokenizer

from quartet.agents.interaction import Interaction, InteractionReply
from quartet.agents.tool_loop import RERENDER_BREAKS, LoopLimits, UserSim, run_tool_loop
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import ChatRenderer, Trajectory
from quartet.rollout.types import FinishReason, GenerationOutput

TURNS = [
    "<think>\nStart in the middle.\n</think>\n\nMy guess is 5.",
    "<think>\nIt is higher than 5.\n</think>\n\nMy guess is 7.",
    "<think>\nLower than 7, higher than 5.\n</think>\n\nMy guess is 6.",
]
REPLIES = ["Higher.", "Lower."]
PROMPT = [{"role": "user", "content": "Guess my number from 1 to 9."}]


class Scripted(Interaction):
    """Answers REPLIES in order, then ends the conversation."""

    default_name = "scripted"

    def __init__(self) -> None:
        super().__init__()
        self.said = 0

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        if self.said == len(REPLIES):
            return InteractionReply("", done=True, score=1.0)
        self.said += 1
        return InteractionReply(REPLIES[self.said - 1], done=False)


class Policy:
    """Returns TURNS' token ids (end-of-turn appended), log-prob -(position+1)/10, recording its prompts."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        self.prompts: list[list[int]] = []
        self.sampled: list[list[int]] = []

    async def __call__(self, prompt_ids: list[int], budget: int) -> GenerationOutput:
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(TURNS[len(self.sampled)] + "<|im_end|>", add_special_tokens=False)
        self.sampled.append(ids)
        logprobs = tuple(-0.1 * (len(self.sampled) * 100 + i) for i in range(len(ids)))
        return GenerationOutput("r", 0, tuple(ids), logprobs, FinishReason.STOP)


def _play(folder: Path, rerender: bool) -> tuple[Trajectory, Policy, Any]:
    tok = AutoTokenizer.from_pretrained(folder)
    policy = Policy(tok)
    limits = LoopLimits(max_assistant_turns=5, max_user_turns=5, max_response_tokens=2048)
    trajectory = asyncio.run(
        run_tool_loop(
            PROMPT,
            policy,
            ChatRenderer(tok),
            get_parser("hermes"),
            {},
            limits,
            user=UserSim(Scripted(), {}),
            rerender=rerender,
        )
    )
    return trajectory, policy, tok


@pytest.fixture(scope="module")
def qwen3_like(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_with_template(tiny_model_dir, QWEN3_LIKE, tmp_path_factory.mktemp("q3") / "tok")


@pytest.fixture(scope="module")
def well_behaved(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_with_template(tiny_model_dir, WELL_BEHAVED, tmp_path_factory.mktemp("wb") / "tok")


def test_keep_history_tokens_is_engine_tokens_plus_rendered_deltas(qwen3_like: Path) -> None:
    trajectory, policy, tok = _play(qwen3_like, rerender=False)
    assert trajectory.finish_reason == "interaction_done" and trajectory.assistant_turns == 3

    def encode(text: str) -> list[int]:
        return list(tok.encode(text, add_special_tokens=False))

    prompt = encode("<|im_start|>user\nGuess my number from 1 to 9.<|im_end|>\n<|im_start|>assistant\n")
    deltas = [encode(f"\n<|im_start|>user\n{r}<|im_end|>\n<|im_start|>assistant\n") for r in REPLIES]
    m1, m2, m3 = policy.sampled
    assert trajectory.prompt_ids == prompt
    assert trajectory.response_ids == m1 + deltas[0] + m2 + deltas[1] + m3
    mask = [1] * len(m1) + [0] * len(deltas[0]) + [1] * len(m2) + [0] * len(deltas[1]) + [1] * len(m3)
    assert trajectory.response_mask == mask
    # each prompt the engine saw is the trajectory so far: the <think> blocks it wrote are still there
    assert policy.prompts[2] == prompt + m1 + deltas[0] + m2 + deltas[1]
    assert "Start in the middle." in tok.decode(policy.prompts[2])
    model_logprobs = [lp for lp, m in zip(trajectory.logprobs, mask, strict=True) if m]
    assert len(model_logprobs) == len(m1 + m2 + m3) and all(lp < 0 for lp in model_logprobs)
    assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, mask, strict=True) if not m)
    assert RERENDER_BREAKS not in trajectory.metrics


def test_rerender_feeds_the_templates_rendering_and_counts_breaks(qwen3_like: Path) -> None:
    trajectory, policy, tok = _play(qwen3_like, rerender=True)
    assert trajectory.assistant_turns == 3
    # two user replies, each dropping the reasoning of the turn before it
    assert trajectory.metrics[RERENDER_BREAKS] == 2.0
    messages: list[dict[str, Any]] = list(PROMPT)
    for k, prompt in enumerate(policy.prompts):
        expected = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert prompt == tok.encode(expected, add_special_tokens=False)
        messages += [{"role": "assistant", "content": TURNS[k]}]
        messages += [{"role": "user", "content": REPLIES[k]}] if k < len(REPLIES) else []
    assert "Start in the middle." not in tok.decode(policy.prompts[2])
    # what the trainer gets: the last prompt and the last turn; only that turn's tokens are in the loss
    m3 = policy.sampled[2]
    assert trajectory.prompt_ids + trajectory.response_ids == policy.prompts[2] + m3
    assert trajectory.response_mask == [0] * (len(trajectory.response_ids) - len(m3)) + [1] * len(m3)
    assert trajectory.logprobs[-len(m3) :] == [-0.1 * (300 + i) for i in range(len(m3))]
    assert all(lp == 0.0 for lp in trajectory.logprobs[: -len(m3)])
    # the turns dropped from the loss stay as empty spans: turns and turn rewards still pair up
    spans = [t for t in trajectory.turns if t.role == "assistant"]
    assert [t.stop - t.start for t in spans] == [0, 0, len(m3)]
    assert len(trajectory.turn_rewards) == 3


def test_rerender_on_a_prefix_safe_template_equals_keep(well_behaved: Path) -> None:
    kept, _, _ = _play(well_behaved, rerender=False)
    fresh, _, _ = _play(well_behaved, rerender=True)
    assert fresh.metrics[RERENDER_BREAKS] == 0.0
    assert (fresh.prompt_ids, fresh.response_ids, fresh.response_mask, fresh.logprobs) == (
        kept.prompt_ids,
        kept.response_ids,
        kept.response_mask,
        kept.logprobs,
    )


def test_rebase_keeps_what_precedes_the_difference_and_masks_the_rest() -> None:
    t = Trajectory([1, 2, 3], [])
    t.add_model_turn([4, 5], [-0.4, -0.5], versions=[7, 7])
    t.add_env_turn("user", [6])
    t.add_model_turn([7, 8], [-0.7, -0.8], versions=[8, 8])
    t.reward_last_turn(1.0)
    # the template rewrites the second model turn (8 -> 9) and adds the new message (10, 11)
    assert t.rebase([1, 2, 3, 4, 5, 6, 7, 9, 10, 11], "user") == 7
    assert t.response_ids == [4, 5, 6, 7, 9, 10, 11]
    assert t.response_mask == [1, 1, 0, 1, 0, 0, 0]
    assert t.logprobs == [-0.4, -0.5, 0.0, -0.7, 0.0, 0.0, 0.0]
    assert t.versions == [7, 7, 0, 8, 0, 0, 0]
    assert [(s.role, s.start, s.stop) for s in t.turns] == [
        ("assistant", 0, 2),
        ("user", 2, 3),
        ("assistant", 3, 4),
        ("user", 4, 7),
    ]
    assert t.turn_rewards == [0.0, 1.0]
    # an extension only appends, and reports no difference before the old end
    assert t.rebase([1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12], "tool") == 10
    assert t.response_ids[-1] == 12 and t.turns[-1].role == "tool"
    # a difference inside the prompt cuts the prompt there; every model turn leaves the loss
    assert t.rebase([1, 2, 99, 4], "user") == 2
    assert (t.prompt_ids, t.response_ids, t.response_mask) == ([1, 2], [99, 4], [0, 0])
    assert [(s.role, s.start, s.stop) for s in t.turns] == [
        ("assistant", 0, 0),
        ("assistant", 0, 0),
        ("user", 0, 2),
    ]
    assert t.assistant_turns == 2
