"""`response_format`, forced `tool_choice`, `models.retrieve` and client hang-ups, with the official client.

The tiny model samples near garbage, so constrained decoding is what makes its output assertable: JSON
that parses and validates against the schema, a call of the right tool with schema-valid arguments.
"""

from __future__ import annotations

import json
import logging
import socket
import time
from typing import Any

import jsonschema
import openai
import pytest
from serving_cases import API_KEY, MESSAGES, MODEL_NAME, chat_prompt, client, direct
from transformers import PreTrainedTokenizerBase

from quartet.rollout import FinishReason, GenerationOutput, TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread
from quartet.serving.constraints import json_grammar
from quartet.serving.responses import chat_response
from quartet.serving.text import tag_token_ids
from quartet.serving.tool_calls import HERMES_TAGS

Served = tuple[OpenAIServer, ServerThread, str]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 99},
        "unit": {"enum": ["cm", "m", "km"]},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "unit", "ok"],
    "additionalProperties": False,
}


def _tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
    parameters = {
        "type": "object",
        "properties": props,
        "required": sorted(props),
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": f"{name} numbers", "parameters": parameters},
    }


SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 99}
TOOLS = [
    _tool("add", {"a": SMALL_INT, "b": SMALL_INT}),
    _tool("scale", {"x": SMALL_INT, "unit": {"enum": ["cm", "m"]}}),
]


def test_models_retrieve_the_served_model_and_404_for_another(served: Served) -> None:
    _, _, url = served
    model = client(url).models.retrieve(MODEL_NAME)
    assert model.id == MODEL_NAME and model.object == "model"
    with pytest.raises(openai.NotFoundError) as err:
        client(url).models.retrieve("org/other-model")
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert "org/other-model" in err.value.body["message"]  # type: ignore[index]


def test_json_schema_responses_parse_and_validate(served: Served) -> None:
    _, _, url = served
    out = client(url).chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        n=3,
        seed=3,
        temperature=1.0,
        max_tokens=80,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
        },
    )
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        assert choice.message.content is not None
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_json_object_is_the_engine_under_the_object_grammar(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    grammar = json_grammar({"type": "object"})
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=24, grammar=grammar)
    out = client(url).chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        temperature=0,
        max_tokens=24,
        response_format={"type": "json_object"},
    )
    content = out.choices[0].message.content
    assert content == serving_tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    assert content is not None and content.startswith("{")


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}, "schema"),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, "json_schema.name"),
        ({"type": "xml"}, "response_format"),
    ],
)
def test_a_bad_response_format_is_a_400_naming_the_field(
    served: Served, fmt: dict[str, Any], param: str
) -> None:
    _, _, url = served
    with pytest.raises(openai.BadRequestError) as err:
        client(url).chat.completions.create(
            model=MODEL_NAME,
            messages=MESSAGES,
            max_tokens=4,
            response_format=fmt,  # type: ignore[arg-type]
        )
    assert err.value.body["param"].endswith(param)  # type: ignore[index]


def _check_call(call: Any, name: str | None = None) -> None:
    tool = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert call.type == "function" and call.function.name in tool
    assert name is None or call.function.name == name
    jsonschema.validate(json.loads(call.function.arguments), tool[call.function.name])


def test_tool_choice_required_calls_a_tool_with_valid_arguments(served: Served) -> None:
    _, _, url = served
    out = client(url).chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=False,
        n=3,
        seed=11,
        temperature=1.0,
        max_tokens=60,
    )
    for choice in out.choices:
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1
        _check_call(calls[0])


def test_a_named_tool_choice_calls_that_tool(served: Served) -> None:
    _, _, url = served
    out = client(url).chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice={"type": "function", "function": {"name": "scale"}},
        temperature=1.0,
        seed=2,
        max_tokens=60,
    )
    [choice] = out.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    _check_call(choice.message.tool_calls[0], "scale")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "divide"}}}, "divide"),
        ({"tool_choice": "required"}, "no 'tools'"),
        ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "combined"),
    ],
)
def test_a_bad_tool_choice_is_a_400(served: Served, extra: dict[str, Any], needle: str) -> None:
    _, _, url = served
    with pytest.raises(openai.BadRequestError) as err:
        client(url).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4, **extra)
    assert needle in err.value.body["message"]  # type: ignore[index]


def test_parallel_tool_calls_false_cuts_an_unforced_response_to_its_first_call(
    serving_tokenizer: PreTrainedTokenizerBase,
) -> None:
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "scale", "arguments": {"x": 3, "unit": "m"}}\n</tool_call>'
    )
    ids = tuple(serving_tokenizer.encode(text, add_special_tokens=False))
    output = GenerationOutput("r", 0, ids, None, FinishReason.STOP)
    tags = tag_token_ids(serving_tokenizer, HERMES_TAGS)
    both = chat_response(MODEL_NAME, 3, [output], serving_tokenizer, False, tags)
    one = chat_response(MODEL_NAME, 3, [output], serving_tokenizer, False, tags, single_call=True)
    assert [c["function"]["name"] for c in both["choices"][0]["message"]["tool_calls"]] == ["add", "scale"]
    assert [c["function"]["name"] for c in one["choices"][0]["message"]["tool_calls"]] == ["add"]


def test_a_client_that_hangs_up_mid_body_is_logged_quietly(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, url = served
    host, port = url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    caplog.set_level(logging.INFO, logger="quartet.serving")
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"model": "tiny-policy", "messages": [')
        time.sleep(0.2)  # let the server start reading the body
    deadline = time.monotonic() + 10
    while not any("hung up" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    records = [r for r in caplog.records if r.name.startswith("quartet.serving")]
    assert any("hung up" in r.getMessage() and r.levelno == logging.INFO for r in records)
    assert not [r for r in records if r.levelno >= logging.WARNING or r.exc_info]
    out = client(url).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert out.choices[0].message.role == "assistant"  # still serving


def test_a_client_that_hangs_up_before_its_answer_leaves_no_error(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    server, _, url = served
    host, port = url.removeprefix("http://").removesuffix("/v1").rsplit(":", 1)
    caplog.set_level(logging.DEBUG)
    body = json.dumps({"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 16, "stream": True}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {API_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(head.encode() + body)
        deadline = time.monotonic() + 10
        while server.in_flight == 0 and time.monotonic() < deadline:  # the request reached the engine
            time.sleep(0.01)
    deadline = time.monotonic() + 30
    while server.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the (unsent) answer is written after the engine returns
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
    out = client(url).chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=2)
    assert out.choices[0].message.role == "assistant"
