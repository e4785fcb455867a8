"""Parsing of request bodies: field-by-field errors, OpenAI defaults, and the token body round trip."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from quartet.rollout import SamplingParams
from quartet.serving import ApiError
from quartet.serving.protocol import (
    SAMPLING_FIELD_KINDS,
    check_model,
    parse_chat,
    parse_completion,
    parse_sampling,
    sampling_to_json,
)

USER = [{"role": "user", "content": "hi"}]


def bad_param(call: Any, *args: Any) -> str | None:
    with pytest.raises(ApiError) as info:
        call(*args)
    assert info.value.status == 400
    return info.value.param


def test_every_sampling_field_has_a_json_kind() -> None:
    assert set(SAMPLING_FIELD_KINDS) == {f.name for f in dataclasses.fields(SamplingParams)}


def test_sampling_round_trips_through_json() -> None:
    params = SamplingParams(0.5, 0.9, 7, 33, 3, 11, (5, 9), ("END", "\n\n"), True, False)
    assert parse_sampling(sampling_to_json(params), default_max_tokens=16) == params
    assert parse_sampling({}, default_max_tokens=16) == SamplingParams(max_new_tokens=16)
    assert parse_sampling(None, default_max_tokens=16).max_new_tokens == 16


@pytest.mark.parametrize(
    ("sampling", "param"),
    [
        ({"top_p": 1.5}, "sampling.top_p"),
        ({"n": 0}, "sampling.n"),
        ({"seed": 1.5}, "sampling.seed"),
        ({"ignore_eos": "yes"}, "sampling.ignore_eos"),
        ({"stop_token_ids": [1, "2"]}, "sampling.stop_token_ids"),
        ({"max_new_tokens": 0}, "sampling.max_new_tokens"),
        ({"temperature": float("nan")}, "sampling.temperature"),
        ({"top_kk": 2}, "sampling.top_kk"),
    ],
)
def test_bad_sampling_fields_are_named(sampling: dict[str, Any], param: str) -> None:
    assert bad_param(parse_sampling, sampling, 16) == param


def test_chat_defaults_and_openai_fields() -> None:
    chat = parse_chat({"messages": USER}, default_max_tokens=16)
    assert chat.sampling == SamplingParams(temperature=1.0, max_new_tokens=16, return_logprobs=False)
    assert chat.tools is None and not chat.logprobs
    body = {"messages": USER, "max_tokens": 5, "max_completion_tokens": 9, "stop": "x", "top_k": 4, "seed": 2}
    chat = parse_chat({**body, "temperature": 0, "logprobs": True, "top_logprobs": 0, "user": "ignored"}, 16)
    assert chat.sampling == SamplingParams(
        0.0, 1.0, 4, 9, 1, 2, (), ("x",), False, True
    )  # max_completion_tokens wins


def test_chat_content_parts_are_joined_and_others_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    chat = parse_chat({"messages": [{"role": "user", "content": parts, "name": "x"}]}, 16)
    assert chat.messages == [{"role": "user", "content": "ab", "name": "x"}]
    image = [{"type": "image_url", "image_url": {"url": "http://x"}}]
    assert (
        bad_param(parse_chat, {"messages": [{"role": "user", "content": image}]}, 16) == "messages[0].content"
    )
    assert bad_param(parse_chat, {"messages": USER, "tool_choice": "required"}, 16) == "tool_choice"
    assert bad_param(parse_chat, {"messages": USER, "tools": {"a": 1}}, 16) == "tools"
    assert bad_param(parse_chat, {"messages": USER, "response_format": {"type": "xml"}}, 16) == (
        "response_format"
    )


def test_completion_prompts() -> None:
    assert parse_completion({"prompt": ["hello"]}, 16).prompt == "hello"  # a batch of one
    assert parse_completion({"prompt": [[1, 2]]}, 16).prompt == (1, 2)
    assert parse_completion({"prompt": [3, 4], "logprobs": 0}, 16).logprobs
    assert bad_param(parse_completion, {"prompt": ["a", "b"]}, 16) == "prompt"
    assert bad_param(parse_completion, {"prompt": ""}, 16) == "prompt"
    assert bad_param(parse_completion, {"prompt": "a", "echo": True}, 16) == "echo"


def test_check_model() -> None:
    check_model({}, "m")
    check_model({"model": "m"}, "m")
    with pytest.raises(ApiError) as info:
        check_model({"model": "other"}, "m")
    assert info.value.status == 404 and info.value.param == "model"
