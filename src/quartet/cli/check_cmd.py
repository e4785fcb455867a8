"""`quartet check template MODEL_DIR [--json]`: does a chat template keep earlier turns' tokens?

Loads the tokenizer and chat template of MODEL_DIR (`AutoTokenizer.from_pretrained`), renders probe
conversations turn by turn (tools, tool calls as text and as structured `tool_calls`, tool results,
simulated-user turns, `<think>` reasoning and `reasoning_content`, with and without a system prompt), and
says for each model turn whether the next rendering extends its token ids (`quartet.agents.template_check`).
At the first break it prints both token strings around the divergence and the rule that broke it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]

_EPILOG = """exit status:
  0  every probe turn keeps the prefix property, and the new messages rendered alone are the template's
     continuation
  1  a break (the first one is printed with its rule: reasoning_dropped, reasoning_rerendered,
     default_system_prompt, tool_call_rerendered, other), or the folder has no usable chat template

A prefix break means a loop that re-renders messages every turn trains on tokens the engine never produced;
quartet's rollout.multi_turn.template_mode=keep_history_tokens (the default) is not affected, strict
refuses such a template. A break of the delta rendered alone (default_system_prompt) concerns loops that
render only the new messages (verl's); quartet's loops are not affected. See docs/multi_turn.md."""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("check", help="checks of a model folder before a run (chat template)")
    checks = parser.add_subparsers(dest="check", required=True)
    template = checks.add_parser(
        "template",
        help="does the chat template keep earlier turns' tokens across a multi-turn conversation",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    template.add_argument(
        "model_dir", help="a folder with a tokenizer and chat template (Hugging Face layout)"
    )
    template.add_argument("--json", action="store_true", help="print the verdict as JSON (every turn)")
    template.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from quartet.agents.template_check import check_model_dir

    try:
        verdict = check_model_dir(args.model_dir)
    except (OSError, ValueError) as err:
        print(f"check template error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(verdict.to_dict(), indent=2, default=str))
        return 0 if verdict.ok else 1
    for turn in verdict.turns:
        state = "extends" if turn.extends else f"BREAK {turn.prefix_break.rule if turn.prefix_break else ''}"
        alone = "" if turn.delta_alone else f"  (alone: {turn.delta_break.rule if turn.delta_break else ''})"
        print(f"  {turn.probe:<36} after model turn {turn.turn}: {state}{alone}")
    first = verdict.first_break()
    if first is not None:
        turn, brk = first
        labels = (
            ("kept (the engine's tokens)", "template's rendering")
            if turn.prefix_break is brk
            else ("template's continuation", "new messages alone")
        )
        print(f"\nfirst break at token {brk.at} (>>> marks it):")
        print(f"  {labels[0]:<26}: {brk.expected!r}")
        print(f"  {labels[1]:<26}: {brk.rendered!r}")
        if brk.detail:
            print(f"  {brk.detail}")
    print(verdict.summary())
    return 0 if verdict.ok else 1
