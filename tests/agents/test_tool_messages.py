"""Tool messages carry their call's `name` and `tool_call_id`: the tool loop over the tiny tokenizer with a
Hermes-style template that refuses a tool message without `name` (template_cases.HERMES_STRICT), a
scripted policy (so the calls are known), the real calculator tool; and the template check on that
template."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from jinja2.exceptions import TemplateError
from template_cases import HERMES_STRICT, save_with_template
from test_tool_loop import ECHO, GOOD, EchoTool, ScriptedPolicy
from transformers import AutoTokenizer

from quartet.agents.template_check import check_model_dir
from quartet.agents.template_probes import Probe, standard_probes
from quartet.agents.tool_loop import MALFORMED_CALL, RERENDER_BREAKS, LoopLimits, run_tool_loop
from quartet.agents.tools.calculator import CalculatorTool
from quartet.agents.tools.parsing import get_parser
from quartet.agents.trajectory import ChatRenderer, Trajectory, token_drift

BAD = "<tool_call>{bad json</tool_call>"


@pytest.fixture(scope="module")
def strict_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_with_template(tiny_model_dir, HERMES_STRICT, tmp_path_factory.mktemp("hermes_strict"))


@pytest.fixture(scope="module")
def renderer(strict_dir: Path) -> ChatRenderer:
    tools = [CalculatorTool().schema, EchoTool.schema]
    return ChatRenderer(AutoTokenizer.from_pretrained(strict_dir), tools=tools)


def _run(renderer: ChatRenderer, rerender: bool = False) -> tuple[Trajectory, ScriptedPolicy]:
    """Two model turns: three calls (one malformed), then the answer."""
    policy = ScriptedPolicy(renderer, [GOOD + BAD + ECHO, "The answer is 391."])
    tools = {"calculator": CalculatorTool(), "echo": EchoTool()}
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    limits = LoopLimits(max_assistant_turns=4, max_response_tokens=1024)
    loop = run_tool_loop(messages, policy, renderer, get_parser("hermes"), tools, limits, rerender=rerender)
    return asyncio.run(loop), policy


def _tool_messages(traj: Trajectory) -> list[dict[str, Any]]:
    return [m for m in traj.messages if m["role"] == "tool"]


def test_tool_messages_carry_the_calls_name_and_id(renderer: ChatRenderer) -> None:
    traj, policy = _run(renderer)
    assert traj.finish_reason == "no_tool_call" and traj.assistant_turns == 2
    calls = traj.messages[1]["tool_calls"]
    assert [(c["id"], c["function"]["name"]) for c in calls] == [
        ("call_0_0", "calculator"),
        ("call_0_1", "echo"),
    ]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"expression": "17 * 23"},
        {"text": "hi"},
    ]
    replies = _tool_messages(traj)
    assert [(m["name"], m["tool_call_id"]) for m in replies] == [
        (MALFORMED_CALL, "call_0_bad0"),
        ("calculator", "call_0_0"),
        ("echo", "call_0_1"),
    ]
    assert "391" in replies[1]["content"] and replies[2]["content"] == "echo: hi"
    assert "tool_calls" not in traj.messages[-1]  # the answer turn called nothing
    # the strict template rendered the tool turn, name and all; tool tokens stay out of the loss
    [tool_span] = [t for t in traj.turns if t.role == "tool"]
    shown = renderer.tokenizer.decode(traj.response_ids[tool_span.start : tool_span.stop])
    assert '<tool_response>\n{"name": "calculator", "content": "391' in shown
    assert set(traj.response_mask[tool_span.start : tool_span.stop]) == {0}
    model = [i for t in traj.turns if t.role == "assistant" for i in range(t.start, t.stop)]
    assert [i for i, m in enumerate(traj.response_mask) if m] == model
    assert [traj.response_ids[i] for i in model] == [x for ids in policy.sampled for x in ids]
    # the conversation re-renders to the same ids: the calls are rendered once, as the model wrote them
    assert token_drift(renderer, traj) == 0


def test_the_same_trajectory_gets_the_same_ids(renderer: ChatRenderer) -> None:
    first, _ = _run(renderer)
    again, _ = _run(renderer)
    assert first.messages == again.messages


def test_rerender_mode_renders_the_calls_once(renderer: ChatRenderer) -> None:
    traj, _ = _run(renderer, rerender=True)
    assert traj.metrics[RERENDER_BREAKS] == 0
    assert [m["name"] for m in _tool_messages(traj)] == [MALFORMED_CALL, "calculator", "echo"]


def test_a_tool_message_without_name_is_refused_by_the_strict_template(renderer: ChatRenderer) -> None:
    traj, _ = _run(renderer)
    old = [{k: v for k, v in m.items() if k != "name"} for m in traj.template_messages()]
    with pytest.raises(TemplateError, match="needs a 'name'"):
        renderer.render(old)
    with pytest.raises(TemplateError, match="needs a 'name'"):
        renderer.env_turn_ids([{"role": "tool", "content": "391"}])


def test_the_template_check_passes_the_strict_template(strict_dir: Path) -> None:
    verdict = check_model_dir(strict_dir)
    assert verdict.ok, verdict.summary()
    assert any(t.probe.startswith("tool_call_text") for t in verdict.turns)
    assert any(t.probe.startswith("tool_call_structured") for t in verdict.turns)


def test_the_probes_pair_each_tool_reply_with_its_call(renderer: ChatRenderer) -> None:
    probes: list[Probe] = standard_probes(lambda m: renderer.render(m), reasoning_field=False)
    structured = [p for p in probes if p.name.startswith("tool_call_structured")]
    assert structured
    for probe in structured:
        [call] = probe.turns[0].message["tool_calls"]
        [reply] = probe.env[0]
        assert (reply["name"], reply["tool_call_id"]) == (call["function"]["name"], call["id"])
