"""Defects hostile clients found in the OpenAI server (issue 50), each driven by the official client.

- tool-call `arguments` must be JSON as RFC 8259 defines it (no NaN / Infinity), checked with a strict parser;
- duplicate function names and a `function_call_output` answering no call are 400s naming the field;
- `max_output_tokens` out of range is reported under that name, not the chat field it becomes;
- a schema wider than llguidance can decode is a 400 naming the limit, not a 500 mid-request;
- a request aiohttp's HTTP parser refuses (huge URL or header, too many headers, bad Content-Length) leaves
  one log line, not a traceback.
"""

from __future__ import annotations

import json
import logging
import math
import random
import socket
import time
from typing import Any
from urllib.parse import urlparse

import jsonschema
import openai
import pytest
from serving_cases import MODEL_NAME, client

from quartet.serving import OpenAIServer, ServerThread
from quartet.serving.constraints import FLOAT_BOUND, finite_numbers
from quartet.serving.limits import MAX_SCHEMA_PROPERTIES
from quartet.serving.responses_api import parse_responses
from quartet.serving.tool_calls import parse_assistant_turn

Served = tuple[OpenAIServer, ServerThread, str]

POINT = {
    "type": "object",
    "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def strict_loads(text: str) -> Any:
    """`json.loads` that refuses NaN and Infinity, as strict parsers (RFC 8259) do; floats must be finite."""
    value = json.loads(text, parse_constant=_refuse_constant)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"non-finite number in {text!r}")
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


def _number(rng: random.Random) -> str:
    """A JSON-looking number as a model may write one: plain, long, huge or tiny exponents, or a constant."""
    kind = rng.randrange(6)
    if kind == 0:
        return rng.choice(["NaN", "Infinity", "-Infinity"])
    digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 400 if kind == 1 else 6)))
    mantissa = ("-" if rng.random() < 0.5 else "") + (digits.lstrip("0") or "0")
    if kind >= 3:
        mantissa += "." + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 20)))
    if kind >= 4:
        mantissa += (
            rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 10 ** rng.randint(1, 5)))
        )
    return mantissa


@pytest.mark.parametrize("seed", range(20))
def test_parsed_tool_call_arguments_are_always_strict_json(seed: int) -> None:
    rng = random.Random(seed)
    finite_seen = 0
    for _ in range(50):
        x, y = _number(rng), _number(rng)
        text = f'<tool_call>\n{{"name": "point", "arguments": {{"x": {x}, "y": {y}}}}}\n</tool_call>'
        turn = parse_assistant_turn(text)
        try:
            expected = strict_loads(f'{{"x": {x}, "y": {y}}}')
        except ValueError:  # not representable as strict JSON: the call is malformed, the text comes back
            assert turn.tool_calls == [] and turn.content == text
            continue
        finite_seen += 1
        [call] = turn.tool_calls
        assert strict_loads(call["function"]["arguments"]) == expected
    assert finite_seen > 0


def test_finite_numbers_bounds_only_unbounded_numbers_and_keeps_their_values() -> None:
    schema = {
        "type": "object",
        "properties": {
            "free": {"type": "number", "description": "any"},
            "ranged": {"type": "number", "minimum": 0, "maximum": 5},
            "list": {"type": "array", "items": {"type": "number"}},
            "pick": {"anyOf": [{"type": "number"}, {"type": "string"}]},
            "fixed": {"const": {"type": "number"}},
        },
    }
    out = finite_numbers(schema)
    props = out["properties"]
    bounded = {"type": "number", "minimum": -FLOAT_BOUND, "maximum": FLOAT_BOUND}
    assert props["free"] == {"description": "any", "anyOf": [{"type": "integer"}, bounded]}
    assert props["ranged"] == schema["properties"]["ranged"]  # type: ignore[index]
    assert props["list"]["items"]["anyOf"][1] == bounded and props["pick"]["anyOf"][0]["anyOf"]
    assert props["fixed"] == {"const": {"type": "number"}}  # data, not a schema
    rng = random.Random(0)
    for _ in range(200):
        value = rng.choice([rng.randint(-(10**30), 10**30), rng.uniform(-1e15, 1e15), rng.random()])
        jsonschema.validate({"free": value, "list": [value], "pick": value}, out)
        jsonschema.validate({"free": value, "list": [value], "pick": value}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"free": 2.5e15}, {**out, "properties": {"free": {"anyOf": [bounded]}}})


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_forced_calls_over_seeds_carry_strict_json_arguments(served: Served, api: str) -> None:
    _, _, url = served
    api_client = client(url)
    tool = {"name": "point", "description": "a point", "parameters": POINT}
    for seed in range(8):
        if api == "chat":
            out = api_client.chat.completions.create(
                model=MODEL_NAME,
                messages=[{"role": "user", "content": "give a point"}],
                tools=[{"type": "function", "function": tool}],  # type: ignore[list-item]
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=80,
                temperature=1.0,
                seed=seed,
            )
            message = out.choices[0].message
            args = [c.function.arguments for c in message.tool_calls or []]  # type: ignore[union-attr]
            # the grammar bounds numbers (constraints.finite_numbers): a finished forced call always parses
            assert args or out.choices[0].finish_reason == "length"
        else:
            resp = api_client.responses.create(
                model=MODEL_NAME,
                input="give a point",
                tools=[{"type": "function", **tool}],  # type: ignore[list-item]
                tool_choice="required",
                parallel_tool_calls=False,
                max_output_tokens=80,
                temperature=1.0,
            )
            args = [o.arguments for o in resp.output if o.type == "function_call"]
            assert args or resp.status == "incomplete"
        for arguments in args:
            point = strict_loads(arguments)
            assert set(point) == {"x", "y"}


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


def test_a_function_call_output_becomes_a_tool_message_named_as_its_call() -> None:
    """Templates such as Hermes' refuse a tool message without `name`: the output carries its call's."""
    calls = [
        {"type": "function_call", "call_id": "call_a", "name": "lookup", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_b", "name": "weather", "arguments": "{}"},
    ]
    answered = ("call_b", "call_a")
    outputs = [{"type": "function_call_output", "call_id": cid, "output": "1"} for cid in answered]
    request = parse_responses({"input": [{"role": "user", "content": "hi"}, *calls, *outputs]}, 16)
    tools = [(m["tool_call_id"], m["name"]) for m in request.chat.messages if m["role"] == "tool"]
    assert tools == [("call_b", "weather"), ("call_a", "lookup")]


@pytest.mark.parametrize("value", [0, -3, 2**31])
def test_max_output_tokens_out_of_range_is_named_as_sent(served: Served, value: int) -> None:
    _, _, url = served
    body = _bad_request(
        lambda: client(url).responses.create(model=MODEL_NAME, input="hi", max_output_tokens=value)
    )
    assert body["param"] == "max_output_tokens"
    assert "'max_output_tokens'" in body["message"] and "max_completion_tokens" not in body["message"]


def _wide(n: int) -> dict[str, Any]:
    """An object schema of n optional string properties, additional ones allowed (the widest parser row)."""
    return {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(n)}}


def test_a_schema_at_the_property_limit_is_enforced(served: Served) -> None:
    _, _, url = served
    out = client(url).chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "fill the form"}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "form", "schema": _wide(MAX_SCHEMA_PROPERTIES)},
        },
        max_tokens=24,
        temperature=1.0,
        seed=0,
    )
    assert out.choices[0].finish_reason in ("stop", "length")


def test_a_schema_over_the_property_limit_is_a_400_on_chat_and_responses(served: Served) -> None:
    _, _, url = served
    api = client(url)
    wide = _wide(MAX_SCHEMA_PROPERTIES + 1)
    nested = {"type": "object", "properties": {"inner": wide}}
    limit = f"at most {MAX_SCHEMA_PROPERTIES}"
    body = _bad_request(
        lambda: api.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "form", "schema": nested}},
            max_tokens=4,
        )
    )
    assert body["param"] == "response_format.json_schema.schema" and limit in body["message"]
    body = _bad_request(
        lambda: api.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "form", "parameters": wide}}],
            tool_choice="required",
            max_tokens=4,
        )
    )
    assert body["param"] == "tools[0].function.parameters" and limit in body["message"]
    body = _bad_request(
        lambda: api.responses.create(
            model=MODEL_NAME,
            input="hi",
            text={"format": {"type": "json_schema", "name": "form", "schema": wide}},  # type: ignore[typeddict-item]
            max_output_tokens=4,
        )
    )
    assert body["param"].startswith("text.format") and limit in body["message"]


def _raw_status(url: str, data: bytes) -> bytes:
    """The status line the server answers to raw bytes (requests no HTTP client would send)."""
    address = urlparse(url)
    assert address.hostname is not None and address.port is not None
    with socket.create_connection((address.hostname, address.port), timeout=10) as sock:
        sock.sendall(data)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


MALFORMED = {
    "a 100 KB URL": b"GET /v1/models?" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "200 headers": b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-H%d: v\r\n" % i for i in range(200))
    + b"\r\n",
    "a 100 KB header": b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 100_000 + b"\r\n\r\n",
    "Content-Length: -5": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_request_the_http_parser_refuses_logs_one_line(
    served: Served, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, _, url = served
    caplog.set_level(logging.DEBUG, logger="quartet.serving.http")
    assert _raw_status(url, MALFORMED[case]).split(b" ")[1] == b"400"
    deadline = time.monotonic() + 5
    while not caplog.records and time.monotonic() < deadline:
        time.sleep(0.02)
    [record] = [r for r in caplog.records if r.name == "quartet.serving.http"]
    text = caplog.text
    assert record.levelno == logging.WARNING and record.exc_info is None and "Traceback" not in text
    assert len(text.strip().splitlines()) == 1 and len(text) < 500
    assert "400" in record.getMessage() and "127.0.0.1" in record.getMessage()
