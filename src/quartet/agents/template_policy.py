"""The chat-template check at the start of a multi-turn run, and what `rollout.multi_turn.template_mode`
does with its verdict.

Before any generation, the run's own first conversations (a few dataset rows, rendered with the run's
tools, continued by probe turns in the form the loops keep history: text, with a reasoning block, a call to
the run's first tool, simulated-user replies where the run has interactions) go through
`quartet.agents.template_check`. The verdict is logged in every mode; then

    keep_history_tokens  nothing more: the engine's tokens are kept whatever the template does to history
                         (a break only means `agent/token_drift` will not be 0)
    strict               a template that breaks the prefix property refuses the run (`TemplateBreakError`)
    rerender             nothing more: the breaks are counted per turn (`agent/template_rerender_breaks`)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from quartet.agents.template_check import RULE_TEXT, TemplateVerdict, check_template
from quartet.agents.template_probes import row_probes
from quartet.agents.trajectory import ChatRenderer
from quartet.config.rollout import TemplateMode

__all__ = ["PREFLIGHT_ROWS", "TemplateBreakError", "preflight_template"]

log = logging.getLogger(__name__)

PREFLIGHT_ROWS = 3
"""Dataset rows the run-start check renders."""


class TemplateBreakError(ValueError):
    """`template_mode=strict` and the chat template does not keep earlier turns' tokens."""


def preflight_template(
    tokenizer: Any,
    mode: TemplateMode,
    rows: Sequence[list[dict[str, Any]]],
    tools: list[dict[str, Any]] | None,
    user_turns: bool,
    model: str = "",
) -> TemplateVerdict:
    """Check the template on the first `PREFLIGHT_ROWS` of `rows` (chat messages), log the verdict, and
    raise `TemplateBreakError` when `mode` is strict and the prefix property breaks (module docstring)."""
    renderer = ChatRenderer(tokenizer, tools or None)
    probes = row_probes(list(rows)[:PREFLIGHT_ROWS], renderer.render, tools or None, user_turns)
    verdict = check_template(tokenizer, probes, model=model)
    if verdict.prefix_safe:
        log.info("chat template check: %s", verdict.summary())
        return verdict
    if mode is TemplateMode.STRICT:
        raise TemplateBreakError(strict_refusal(verdict))
    consequence = (
        "the engine's tokens are kept, so training is token-exact; agent/token_drift will not be 0"
        if mode is not TemplateMode.RERENDER
        else "earlier model turns the template changes are masked out of the loss, counted in "
        "agent/template_rerender_breaks"
    )
    log.warning("chat template check: %s; template_mode=%s: %s", verdict.summary(), mode, consequence)
    return verdict


def strict_refusal(verdict: TemplateVerdict) -> str:
    """The strict mode's error: the model, the row and turn, the rule, both token strings, the fix."""
    first = verdict.first_break()
    if first is None or first[0].prefix_break is None:
        return f"{verdict.model}: the chat template keeps the prefix property"
    turn, brk = first[0], first[0].prefix_break
    return (
        f"rollout.multi_turn.template_mode=strict: the chat template of {verdict.model} does not extend the "
        f"tokens of earlier turns (dataset {turn.probe}, after model turn {turn.turn}, token {brk.at}): "
        f"{brk.rule}, {RULE_TEXT[brk.rule]}.\n  engine's tokens: {brk.expected!r}\n  "
        f"template's:      {brk.rendered!r}\n  fix: set rollout.multi_turn.template_mode=keep_history_tokens "
        "(train on the engine's tokens, render only new messages) or rerender (the engine sees the "
        "template's rendering; changed turns leave the loss), or use a chat template that keeps history "
        "(`quartet check template MODEL_DIR` checks one)"
    )
