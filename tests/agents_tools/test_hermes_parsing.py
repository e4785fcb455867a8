"""Hermes tool-call parsing: good calls, malformed ones reported (never raised), the parser registry."""

from __future__ import annotations

import json

import pytest

from quartet.agents.tools.parsing import PARSERS, HermesParser, ToolCall, get_parser


def _block(obj: object) -> str:
    return f"<tool_call>\n{json.dumps(obj)}\n</tool_call>"


def test_one_call_with_text_around() -> None:
    text = (
        "Let me compute.\n" + _block({"name": "calculator", "arguments": {"expression": "1+1"}}) + "\nDone."
    )
    parsed = HermesParser().parse(text)
    assert parsed.calls == [ToolCall("calculator", {"expression": "1+1"})]
    assert parsed.errors == []
    assert parsed.content == "Let me compute.\n\nDone."


def test_two_calls_in_order() -> None:
    text = _block({"name": "a", "arguments": {"x": 1}}) + _block({"name": "b", "arguments": {"y": [2]}})
    parsed = HermesParser().parse(text)
    assert [c.name for c in parsed.calls] == ["a", "b"]
    assert parsed.calls[1].arguments == {"y": [2]}
    assert parsed.content == ""


def test_arguments_as_json_string_and_missing_arguments() -> None:
    inner = json.dumps({"code": "print(1)\nprint(2)"})
    parsed = HermesParser().parse(_block({"name": "python", "arguments": inner}) + _block({"name": "now"}))
    assert parsed.calls == [ToolCall("python", {"code": "print(1)\nprint(2)"}), ToolCall("now", {})]


def test_raw_newline_inside_a_string_is_accepted() -> None:
    text = '<tool_call>{"name": "python", "arguments": {"code": "a = 1\nprint(a)"}}</tool_call>'
    assert HermesParser().parse(text).calls == [ToolCall("python", {"code": "a = 1\nprint(a)"})]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('{"name": "calc", "arguments": {"x": 1}', "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"arguments": {}}', 'missing "name"'),
        ('{"name": "", "arguments": {}}', 'missing "name"'),
        ('{"name": "calc", "arguments": [1]}', "must be a JSON object, got list"),
        ('{"name": "calc", "arguments": "{not json"}', "a string that is not valid JSON"),
    ],
)
def test_malformed_call_is_an_error_line(body: str, message: str) -> None:
    good = _block({"name": "ok", "arguments": {}})
    parsed = HermesParser().parse(f"before {good} <tool_call>{body}</tool_call> after")
    assert parsed.calls == [ToolCall("ok", {})], "a bad call does not hide the good ones"
    assert len(parsed.errors) == 1
    assert message in parsed.errors[0] and parsed.errors[0].startswith("tool call 2:")
    assert parsed.content == "before   after"  # the spaces around both blocks stay


def test_unclosed_tag() -> None:
    parsed = HermesParser().parse('Sure. <tool_call>{"name": "calc", "arguments": {}}')
    assert parsed.calls == []
    assert len(parsed.errors) == 1 and "unclosed <tool_call>" in parsed.errors[0]
    assert parsed.content == "Sure."


def test_unclosed_tag_followed_by_a_good_call() -> None:
    text = '<tool_call>{"name": "a"' + _block({"name": "b", "arguments": {}})
    parsed = HermesParser().parse(text)
    assert parsed.calls == [ToolCall("b", {})]
    assert len(parsed.errors) == 1 and "unclosed" in parsed.errors[0]


def test_plain_text_has_no_calls() -> None:
    parsed = HermesParser().parse("  The answer is 42.  ")
    assert (parsed.content, parsed.calls, parsed.errors) == ("The answer is 42.", [], [])


def test_registry() -> None:
    assert isinstance(get_parser("Hermes"), HermesParser)
    assert "hermes" in PARSERS
    with pytest.raises(
        ValueError, match=r"unknown tool-call parser 'hermez'.*known parsers: hermes.*'hermes'"
    ):
        get_parser("hermez")
