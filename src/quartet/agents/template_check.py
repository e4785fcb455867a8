"""Does a chat template keep the tokens of earlier turns when a conversation grows? (the prefix property)

Token-in/token-out RL trains on the tokens the engine produced. A loop that re-renders the conversation from
its messages every turn (as an OpenAI-compatible client does) feeds the engine what the template writes,
and many templates write earlier turns differently from how the model wrote them: Qwen3-style templates
drop the `<think>` block of assistant turns before the last user message, some re-spell tool calls as
their own JSON, some insert a default system prompt when the rendered messages have none. Then the tokens
of turn k are not a prefix of the rendering after turn k+1.

For every probe conversation (`quartet.agents.template_probes`) and every model turn k followed by
environment messages, the check compares, on token ids:

    kept  = render(messages before turn k, add_generation_prompt) + the model's tokens + end-of-turn
    fresh = render(messages through the environment's answer to turn k, add_generation_prompt)

`extends` holds when `kept` is a prefix of `fresh`. A break names the rule that caused it
(`BreakRule`), found from where the ids first differ and what the probe put there. Where `extends` holds,
the check also renders the environment's new messages alone, as the template's turn wrapper, after the
template's separator (`delta_alone`): what a loop that appends only the new messages' own rendering
(verl's) would add. A default system prompt breaks that; quartet's loops take the delta as the difference
of two renders (`ChatRenderer.env_turn_ids`) and are not affected by it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from quartet.agents.template_probes import Probe, standard_probes
from quartet.agents.trajectory import ChatRenderer, first_difference

__all__ = [
    "RULE_TEXT",
    "BreakRule",
    "TemplateBreak",
    "TemplateVerdict",
    "TurnCheck",
    "check_model_dir",
    "check_template",
]

_WINDOW = 24  # tokens shown each side of a divergence
_HERE = " >>> "


class BreakRule(StrEnum):
    """Why a template's rendering of a longer conversation does not extend the earlier tokens."""

    REASONING_DROPPED = "reasoning_dropped"
    REASONING_RERENDERED = "reasoning_rerendered"
    DEFAULT_SYSTEM_PROMPT = "default_system_prompt"
    TOOL_CALL_RERENDERED = "tool_call_rerendered"
    OTHER = "other"


RULE_TEXT: dict[BreakRule, str] = {
    BreakRule.REASONING_DROPPED: "the template drops the reasoning (<think>) of an earlier assistant turn",
    BreakRule.REASONING_RERENDERED: "the template re-writes an earlier turn's reasoning block (other "
    "whitespace or tags than the model wrote)",
    BreakRule.DEFAULT_SYSTEM_PROMPT: "the template inserts a default system prompt",
    BreakRule.TOOL_CALL_RERENDERED: "the template re-renders an earlier tool call in its own JSON spelling",
    BreakRule.OTHER: "the template renders earlier tokens differently",
}
"""One line per rule, for reports."""


@dataclass(frozen=True)
class TemplateBreak:
    """Where two token sequences part: the rule, the token index, both decoded around it."""

    rule: BreakRule
    at: int
    expected: str
    """The tokens the loop holds (the engine's), decoded around `at`; `>>>` marks the first difference."""
    rendered: str
    """The template's rendering, decoded around `at`."""
    detail: str = ""


@dataclass(frozen=True)
class TurnCheck:
    """One probe's model turn: does the next rendering extend its tokens (and the delta rendered alone)."""

    probe: str
    turn: int
    """The model turn (1-based) after which the conversation is rendered again."""
    extends: bool
    delta_alone: bool
    prefix_break: TemplateBreak | None = None
    delta_break: TemplateBreak | None = None


@dataclass(frozen=True)
class TemplateVerdict:
    """The check's result over all probes (see the module docstring)."""

    model: str
    turns: tuple[TurnCheck, ...]

    @property
    def prefix_safe(self) -> bool:
        """Every rendering extends the tokens of the turn before: keeping the engine's tokens and
        re-rendering the messages give the same prompts."""
        return all(t.extends for t in self.turns)

    @property
    def delta_alone_safe(self) -> bool:
        """The new messages rendered alone are what the template adds for them in the whole conversation."""
        return all(t.delta_alone for t in self.turns)

    @property
    def ok(self) -> bool:
        return self.prefix_safe and self.delta_alone_safe

    def first_break(self) -> tuple[TurnCheck, TemplateBreak] | None:
        """The first prefix break, else the first break of the delta rendered alone; None when `ok`."""
        for turn in self.turns:
            if turn.prefix_break is not None:
                return turn, turn.prefix_break
        for turn in self.turns:
            if turn.delta_break is not None:
                return turn, turn.delta_break
        return None

    def rules(self) -> list[BreakRule]:
        """The rules that broke, each once, in the order met (prefix breaks first)."""
        found = [t.prefix_break.rule for t in self.turns if t.prefix_break is not None]
        found += [t.delta_break.rule for t in self.turns if t.delta_break is not None]
        return list(dict.fromkeys(found))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the flags, the rules, every turn."""
        return {
            "model": self.model,
            "ok": self.ok,
            "prefix_safe": self.prefix_safe,
            "delta_alone_safe": self.delta_alone_safe,
            "rules": [str(r) for r in self.rules()],
            "turns": [asdict(t) for t in self.turns],
        }

    def summary(self) -> str:
        """One line: the verdict and the first break's probe, turn and rule."""
        first = self.first_break()
        if first is None:
            return f"{self.model}: prefix-safe on every probe turn ({len(self.turns)} checked)"
        turn, brk = first
        what = "prefix property broken" if turn.prefix_break is brk else "new messages rendered alone differ"
        return (
            f"{self.model}: {what} at probe {turn.probe!r}, after model turn {turn.turn}: "
            f"{brk.rule} ({RULE_TEXT[brk.rule]})"
        )


def check_model_dir(model_dir: str | Path, probes: Sequence[Probe] | None = None) -> TemplateVerdict:
    """Load the tokenizer (and its chat template) of `model_dir` with `AutoTokenizer.from_pretrained` and
    check it on `probes` (the standard ones by default). ValueError when it is not a folder or has no chat
    template."""
    from transformers import AutoTokenizer

    if not Path(model_dir).is_dir():
        raise ValueError(
            f"{model_dir} is not a folder. Fix: pass a local model folder (tokenizer files and chat template)"
        )
    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{model_dir}: the tokenizer has no chat template. Fix: point at a chat model's folder, or "
            "set tokenizer.chat_template and save it there"
        )
    return check_template(tokenizer, probes, model=str(model_dir))


def check_template(tokenizer: Any, probes: Sequence[Probe] | None = None, model: str = "") -> TemplateVerdict:
    """The verdict of `tokenizer`'s chat template on `probes` (default: `standard_probes`, with
    `reasoning_content` probed where the template's source mentions it)."""
    if probes is None:
        template = str(getattr(tokenizer, "chat_template", "") or "")
        probe_renderer = ChatRenderer(tokenizer, _probe_tools())
        probes = standard_probes(probe_renderer.render, "reasoning_content" in template)
    renderers: dict[str, ChatRenderer] = {}
    turns: list[TurnCheck] = []
    for probe in probes:
        key = repr(probe.tools)
        if key not in renderers:
            renderers[key] = ChatRenderer(tokenizer, probe.tools)
        turns += _check_probe(probe, renderers[key])
    name = model or str(getattr(tokenizer, "name_or_path", "") or "the tokenizer")
    return TemplateVerdict(name, tuple(turns))


def _probe_tools() -> list[dict[str, Any]]:
    from quartet.agents.template_probes import PROBE_TOOLS

    return PROBE_TOOLS


def _check_probe(probe: Probe, renderer: ChatRenderer) -> list[TurnCheck]:
    """Each model turn of `probe` that the environment answers: kept ids against the next rendering."""
    eot = renderer.encode(renderer.end_of_turn)
    history = [dict(m) for m in probe.prompt]
    out = []
    for k, (turn, answer) in enumerate(zip(probe.turns, probe.env, strict=True)):
        following = [*history, turn.message, *answer]
        if answer:
            try:
                kept = renderer.prompt_ids(history) + renderer.encode(turn.raw) + eot
                fresh = renderer.prompt_ids(following)
            except Exception as err:  # noqa: BLE001 - a template that refuses the probe is a finding too
                brk = TemplateBreak(BreakRule.OTHER, 0, "", "", f"the template refuses to render it: {err}")
                out.append(TurnCheck(probe.name, k + 1, False, False, brk))
                return out
            out.append(_turn_check(probe, k, renderer, kept, fresh, answer))
        history = following
    return out


def _turn_check(
    probe: Probe, k: int, renderer: ChatRenderer, kept: list[int], fresh: list[int], answer: list[Any]
) -> TurnCheck:
    """Prefix property of turn k; where it holds, the new messages rendered alone against the continuation."""
    at = first_difference(kept, fresh)
    if at < len(kept):
        rule = _prefix_rule(probe, k, renderer, kept, fresh, at)
        brk = TemplateBreak(rule, at, _window(renderer, kept, at), _window(renderer, fresh, at))
        return TurnCheck(probe.name, k + 1, False, True, brk)
    continuation = fresh[len(kept) :]
    try:
        alone_text = renderer.separator + str(
            renderer.tokenizer.apply_chat_template(answer, add_generation_prompt=True, tokenize=False)
        )
    except Exception as err:  # noqa: BLE001 - e.g. a template that wants a user message first
        brk = TemplateBreak(BreakRule.OTHER, 0, "", "", f"the template refuses the new messages alone: {err}")
        return TurnCheck(probe.name, k + 1, True, False, None, brk)
    alone = renderer.encode(alone_text)
    if alone == continuation:
        return TurnCheck(probe.name, k + 1, True, True)
    at = first_difference(continuation, alone)
    shown_c, shown_a = _window(renderer, continuation, at), _window(renderer, alone, at)
    rule = BreakRule.DEFAULT_SYSTEM_PROMPT if _system_after(shown_a, shown_c) else BreakRule.OTHER
    extra = len(alone) - len(continuation)
    detail = (
        f"a loop that appends the new messages rendered alone must drop their first {extra} tokens"
        if extra > 0 and alone[extra:] == continuation
        else "the new messages rendered alone are not the template's continuation"
    )
    return TurnCheck(probe.name, k + 1, True, False, None, TemplateBreak(rule, at, shown_c, shown_a, detail))


def _prefix_rule(
    probe: Probe, k: int, renderer: ChatRenderer, kept: list[int], fresh: list[int], at: int
) -> BreakRule:
    """Name the rule behind a prefix break at token `at` of model turn `k`'s kept ids."""
    decode = renderer.tokenizer.decode
    kept_text, fresh_text = str(decode(kept)), str(decode(fresh))
    reasonings = [t.reasoning for t in probe.turns[: k + 1] if t.reasoning]
    if any(kept_text.count(r) > fresh_text.count(r) for r in reasonings):
        return BreakRule.REASONING_DROPPED
    turn = probe.turns[k]
    start = len(kept) - len(renderer.encode(turn.raw)) - len(renderer.encode(renderer.end_of_turn))
    if at >= start:  # inside the model turn just written
        if turn.reasoning and turn.reasoning in turn.raw:
            think_end = turn.raw.find(turn.reasoning) + len(turn.reasoning)
            closing = turn.raw.find(">", think_end)
            if at < start + len(renderer.encode(turn.raw[: closing + 1])):
                return BreakRule.REASONING_RERENDERED
        name = re.search(r'"name"\s*:\s*"([^"]+)"', turn.tool_call)
        if name and name.group(1) in str(decode(fresh[at:])):  # the call is still there, spelled otherwise
            return BreakRule.TOOL_CALL_RERENDERED
    if _system_after(_window(renderer, fresh, at), _window(renderer, kept, at)):
        return BreakRule.DEFAULT_SYSTEM_PROMPT
    return BreakRule.OTHER


def _system_after(rendered: str, expected: str) -> bool:
    """The rendering, after the marked difference, starts a system block that the expected text lacks."""
    after_r = rendered.split(_HERE, 1)[-1].lower()
    after_e = expected.split(_HERE, 1)[-1].lower()
    return "system" in after_r and "system" not in after_e


def _window(renderer: ChatRenderer, ids: Sequence[int], at: int) -> str:
    """`ids` decoded around `at` (special tokens kept), `>>>` at `at`."""
    decode = renderer.tokenizer.decode
    before = decode(list(ids[max(0, at - _WINDOW) : at]), skip_special_tokens=False)
    after = decode(list(ids[at : at + _WINDOW]), skip_special_tokens=False)
    return f"{before}{_HERE}{after}"
