"""Token-exact multi-turn trajectories: model tokens as generated, environment turns rendered once.

A trajectory is the prompt's token ids followed by a response that alternates model turns (tokens exactly as
the engine sampled them, `response_mask` 1, with their log-probs) and environment turns (tool results or a
simulated user's reply, plus the next assistant header, rendered through the tokenizer's chat template,
`response_mask` 0, log-prob 0). History is never re-tokenized: each piece is tokenized once, when it is
added, so the trainer scores exactly the tokens the policy produced.

Rendering an environment turn (`ChatRenderer.env_turn_ids`). With a ChatML-like template an assistant
message renders as `<|im_start|>assistant\\n{content}<|im_end|>\\n`; the model's turn ends at its end-of-turn
token, so what follows it in the template (here "\\n") belongs to the environment's tokens. The renderer
finds that separator by rendering a placeholder conversation, then takes the text the template adds for the
new messages and the generation prompt, and tokenizes separator + that text once:

    base = render([user, assistant(PLACEHOLDER)])                    # ends "...PLACEHOLDER<eot>\\n"
    full = render([user, assistant(PLACEHOLDER), *new], gen_prompt)  # base + new turns + assistant header
    env  = tokenize(base[after <eot>:] + full[len(base):])

Why a difference against a placeholder conversation, and not one of the other two ways to get the delta:
rendering [real history + new] minus [real history] would carry into the delta whatever the template
changes in the real history (a dropped `<think>` block, a re-spelled tool call: the two renders then do not
even share a prefix), and rendering the new messages alone, with the template's turn wrapper, picks up
what the template writes at the start of any conversation (a default system prompt, the tool list;
verl's loop measures and strips that prefix). The placeholder turn has no reasoning, no tool call and no
history, so only the template's rules for the new messages and the generation prompt reach the delta; a
template that still renders the placeholder conversation differently once messages follow it is refused
with a ValueError. `quartet.agents.template_check` tells which templates keep the prefix property at all.

Drift check (`token_drift`): the whole conversation re-rendered by the template in one go and tokenized, as
a chat-template-based trainer would see it, against the trajectory's ids. Zero for a template and tokenizer
that round-trip; a model that writes a non-canonical tokenization (possible with BPE) shows up here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

from quartet.agents.routing_track import RoutingTrack

if TYPE_CHECKING:
    import torch

    from quartet.agents.images import TrajectoryImages

__all__ = ["AgentFinishReason", "ChatRenderer", "Trajectory", "TurnSpan", "first_difference", "token_drift"]

_PLACEHOLDER = "\u2063quartet-placeholder\u2063"


class AgentFinishReason(StrEnum):
    """Why an agent loop ended a trajectory (the rollout batch's `finish_reason` column and the
    `agent/finish/<reason>` metrics); the engine's own reasons for one generation are `FinishReason`."""

    NO_TOOL_CALL = "no_tool_call"  # the model answered without a tool call (and no simulated user)
    MAX_TURNS = "max_turns"  # max_assistant_turns model turns
    MAX_USER_TURNS = "max_user_turns"  # max_user_turns simulated-user replies
    MAX_TOKENS = "max_tokens"  # the response reached max_response_tokens
    LENGTH = "length"  # a model turn was cut by the engine's length limit before the response's
    ABORT = "abort"  # the engine aborted a generation
    INTERACTION_DONE = "interaction_done"  # the simulated user ended the conversation
    DEADLINE = "deadline"  # cut at the step's deadline (rollout.multi_turn.step_deadline_s)
    ENV_DONE = "env_done"  # an environment's step said the episode is done (quartet.environments)
    ENV_ERROR = "env_error"  # an environment raised, hung or answered wrongly: a bad row, not trained


@dataclass(frozen=True)
class TurnSpan:
    """One turn's place in the response: tokens [start, stop) written by `role`."""

    role: str
    """"assistant" (the model) or the environment's message role ("tool", "user")."""
    start: int
    stop: int


@dataclass
class Trajectory:
    """Prompt ids and the response built turn by turn (see the module docstring)."""

    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    """The conversation as chat messages (assistant content = the decoded model turn)."""
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] | None = field(default_factory=list)
    """Per response token, the engine's weight version behind it (0 on environment tokens); None once a
    model turn came from an engine that does not tag versions."""
    turns: list[TurnSpan] = field(default_factory=list)
    finish_reason: AgentFinishReason | Literal[""] = ""
    """Why the loop ended ("" while it runs)."""
    reward: float | None = None
    """A score from the environment (a tool's or the interaction's), when it gives one."""
    metrics: dict[str, float] = field(default_factory=dict)
    truncated: bool = False
    """The response was cut to the trainer's width (`truncate`): the conversation goes on past its ids."""
    images: TrajectoryImages | None = None
    """The trajectory's images (`quartet.agents.images.TrajectoryImages`: prompt's, then the tools'), for
    a vision-language model; None for text."""
    error: str = ""
    """Why the environment failed this trajectory (finish_reason env_error): environment, row, turn and
    the error, in one line; the scorer of `env/...` rows reports it as a failed row."""
    turn_rewards: list[float] = field(default_factory=list)
    """One per model turn: what the environment rewarded that turn with alone (a tool call's reward, a
    simulated user's `turn_reward`); 0.0 where it gave nothing (quartet.core.turn_credit)."""
    routing: RoutingTrack | None = None
    """The MoE routing record of prompt + response, turn by turn (`routing_track`: which record a token
    processed by several turns keeps); None until a model turn brings one, and for good once one does not
    (`routing_lost`)."""
    routing_lost: bool = False
    """A model turn came without a routing record: the trajectory has none (routing replay refuses it)."""
    calls_in_text: list[int] = field(default_factory=list)
    """Indexes of `messages` whose `content` is the model's text spelling their `tool_calls` (the loop's
    model turns): the `tool_calls` (with the ids their tool messages answer) are there for readers, and
    left out where the template renders the conversation (`template_messages`)."""

    def template_messages(self) -> list[dict[str, Any]]:
        """The conversation as the chat template renders it: the model's turns as written (their content),
        without the `tool_calls` that content already spells, which the template would render again."""
        drop = set(self.calls_in_text)
        return [
            {k: v for k, v in m.items() if k != "tool_calls"} if i in drop else m
            for i, m in enumerate(self.messages)
        ]

    @property
    def assistant_turns(self) -> int:
        return sum(1 for t in self.turns if t.role == "assistant")

    def add_model_turn(
        self,
        token_ids: list[int],
        logprobs: list[float] | None,
        versions: Sequence[int] | None = None,
        routing: torch.Tensor | None = None,
    ) -> None:
        """Append the model's tokens exactly as generated (mask 1), with their weight versions if known and
        the engine's MoE routing record of the call (`GenerationOutput.routed_experts`: the conversation so
        far, then the new tokens but the last), which `routing` merges (`routing_track`)."""
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"{len(logprobs)} log-probs for {len(token_ids)} tokens")
        if routing is None:
            self.routing = None
            self.routing_lost = True
        elif not self.routing_lost:
            self.routing = self.routing or RoutingTrack()
            self.routing.add_turn(len(self.prompt_ids) + len(self.response_ids), len(token_ids), routing)
        if versions is None or len(versions) != len(token_ids):
            self.versions = None
        elif self.versions is not None:
            self.versions += list(versions)
        start = len(self.response_ids)
        self.response_ids += token_ids
        self.response_mask += [1] * len(token_ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        self.turns.append(TurnSpan("assistant", start, len(self.response_ids)))
        self.turn_rewards.append(0.0)

    def reward_last_turn(self, value: float) -> None:
        """Add `value` to the reward of the latest model turn."""
        if not self.turn_rewards:
            raise ValueError("no model turn to reward yet")
        self.turn_rewards[-1] += float(value)

    def add_env_turn(self, role: str, token_ids: list[int]) -> None:
        """Append environment tokens (mask 0, log-prob 0)."""
        start = len(self.response_ids)
        self.response_ids += token_ids
        self.response_mask += [0] * len(token_ids)
        self.logprobs += [0.0] * len(token_ids)
        if self.versions is not None:
            self.versions += [0] * len(token_ids)
        self.turns.append(TurnSpan(role, start, len(self.response_ids)))

    def rebase(self, ids: list[int], role: str) -> int:
        """Make prompt + response equal `ids`, the template's rendering of the whole conversation (the
        `rerender` template mode). Tokens before the first difference keep their mask, log-probs and turns:
        same tokens after the same context, so the engine's log-probs still hold. The rest of `ids` becomes
        one environment span of `role` (mask 0, log-prob 0): tokens the engine did not sample in this
        context are not trained. A model turn wholly past the difference stays in `turns` as an empty span,
        so turns and turn rewards still pair up (its reward has no token to land on). Where the difference
        lies inside the prompt, the prompt is cut there. Returns the index of the first difference (the old
        length when `ids` only extends the sequence)."""
        old = self.prompt_ids + self.response_ids
        at = first_difference(old, ids)
        if at < len(self.prompt_ids):
            self.prompt_ids = list(ids[:at])
        keep = at - len(self.prompt_ids)
        del self.response_ids[keep:], self.response_mask[keep:], self.logprobs[keep:]
        if self.versions is not None:
            del self.versions[keep:]
        if self.routing is not None:
            self.routing.cut(at)
        turns = []
        for t in self.turns:
            if t.start < keep:
                turns.append(TurnSpan(t.role, t.start, min(t.stop, keep)))
            elif t.role == "assistant":
                turns.append(TurnSpan("assistant", keep, keep))
        self.turns = turns
        if at < len(ids):
            self.add_env_turn(role, list(ids[at:]))
        return at

    def truncate(self, max_tokens: int) -> None:
        """Cut the response to `max_tokens` (the trainer's response width)."""
        if len(self.response_ids) <= max_tokens:
            return
        self.truncated = True
        del self.response_ids[max_tokens:], self.response_mask[max_tokens:], self.logprobs[max_tokens:]
        if self.versions is not None:
            del self.versions[max_tokens:]
        if self.routing is not None:
            self.routing.cut(len(self.prompt_ids) + max_tokens)
        kept = [t.start < max_tokens for t in self.turns if t.role == "assistant"]
        self.turn_rewards = [r for r, keep in zip(self.turn_rewards, kept, strict=True) if keep]
        self.turns = [
            TurnSpan(t.role, t.start, min(t.stop, max_tokens)) for t in self.turns if t.start < max_tokens
        ]


class ChatRenderer:
    """Chat messages -> token ids through the tokenizer's chat template, for prompts and environment turns."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        eot = tokenizer.eos_token
        if not eot:
            raise ValueError("the tokenizer has no end-of-sequence token to end assistant turns with")
        self.end_of_turn = str(eot)
        base = self.render([{"role": "user", "content": "u"}, _assistant(_PLACEHOLDER)])
        after = base.rfind(_PLACEHOLDER)
        eot_at = base.find(self.end_of_turn, after)
        if after < 0 or eot_at < 0:
            raise ValueError(
                "the chat template does not end an assistant message with the end-of-sequence token "
                f"{self.end_of_turn!r}; multi-turn token bookkeeping needs it"
            )
        self._base = base
        self.separator = base[eot_at + len(self.end_of_turn) :]
        """Text the template writes after an assistant's end-of-turn token (ChatML: a newline)."""

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        text = self.tokenizer.apply_chat_template(
            messages, tools=self.tools, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt and the first assistant header."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def env_turn_ids(self, new_messages: list[dict[str, Any]], ended_with_eot: bool = True) -> list[int]:
        """Tokens after a model turn: the template's separator, `new_messages`, the next assistant header.

        `ended_with_eot=False` (the model's turn stopped without its end-of-turn token, e.g. at a stop
        string) adds the end-of-turn token first, as the template would have it.
        """
        conversation = [{"role": "user", "content": "u"}, _assistant(_PLACEHOLDER), *new_messages]
        full = self.render(conversation, add_generation_prompt=True)
        if not full.startswith(self._base):
            raise ValueError("the chat template renders earlier messages differently once more are added")
        prefix = "" if ended_with_eot else self.end_of_turn
        return self.encode(prefix + self.separator + full[len(self._base) :])


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """The first index where `a` and `b` differ; min(len) when one is a prefix of the other."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _assistant(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def token_drift(renderer: ChatRenderer, trajectory: Trajectory) -> int:
    """Positions where a one-shot re-render of the conversation differs from the trajectory's ids (plus the
    length difference); 0 when they agree token for token. A trajectory cut by the token limit is compared
    over the ids it has."""
    messages = trajectory.template_messages()
    text = renderer.render(messages, add_generation_prompt=messages[-1]["role"] != "assistant")
    expected = renderer.encode(text)
    actual = trajectory.prompt_ids + trajectory.response_ids
    eot = renderer.encode(renderer.end_of_turn)
    if messages[-1]["role"] == "assistant" and actual[-len(eot) :] == eot:
        actual = actual + renderer.encode(renderer.separator)  # the template's tail after the last turn
    elif trajectory.truncated or messages[-1]["role"] == "assistant":
        # cut by the token limit (mid-turn, or its tokens truncated): the re-render goes on where the ids
        # stop (the rest of the turn, the end-of-turn token the model never wrote); compare what exists
        expected = expected[: len(actual)]
    common = min(len(expected), len(actual))
    return sum(1 for a, b in zip(expected[:common], actual[:common], strict=True) if a != b) + abs(
        len(expected) - len(actual)
    )
