"""`POST /v1/responses` driven by the official client's `client.responses.create`.

Text answers are checked against the same prompt generated directly through the engine; tool calls are
forced (constrained decoding), so the tiny model's calls are assertable.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from serving_cases import MESSAGES, MODEL_NAME, chat_prompt, client, direct
from transformers import PreTrainedTokenizerBase

from quartet.rollout import TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread

Served = tuple[OpenAIServer, ServerThread, str]

PARAMS = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"enum": ["x", "y"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "lookup", "description": "look up a number", "parameters": PARAMS}
OTHER = {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}}


def test_a_string_input_with_instructions_is_the_chat_answer(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    messages = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    [ref] = direct(
        serving_engine, chat_prompt(serving_tokenizer, messages), temperature=0.0, max_new_tokens=12
    )
    out = client(url).responses.create(
        model=MODEL_NAME,
        input=MESSAGES[0]["content"],
        instructions="Be brief.",
        max_output_tokens=12,
        temperature=0,
    )
    assert out.object == "response" and out.model == MODEL_NAME and out.id.startswith("resp_")
    assert out.output_text == serving_tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    [item] = out.output
    assert item.type == "message" and item.role == "assistant"
    cut = ref.finish_reason.value == "length"
    assert out.status == ("incomplete" if cut else "completed")
    assert (out.incomplete_details is not None) == cut
    assert out.usage is not None and out.usage.output_tokens == len(ref.token_ids)
    assert out.instructions == "Be brief."


def test_a_forced_call_then_its_output_in_the_next_turn(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    api = client(url)
    first = api.responses.create(
        model=MODEL_NAME,
        input=[{"role": "user", "content": "look up a"}],
        tools=[TOOL, OTHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "lookup"},
        max_output_tokens=60,
        temperature=1.0,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "lookup" and first.status == "completed"
    jsonschema.validate(json.loads(calls[0].arguments), PARAMS)
    history: list[Any] = [
        {"role": "user", "content": "look up a"},
        {
            "type": "function_call",
            "call_id": calls[0].call_id,
            "name": "lookup",
            "arguments": calls[0].arguments,
        },
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "42"},
    ]
    second = api.responses.create(
        model=MODEL_NAME, input=history, tools=[TOOL], max_output_tokens=8, temperature=0
    )
    chat_history = [
        {"role": "user", "content": "look up a"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].call_id,
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.loads(calls[0].arguments)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "42"},
    ]
    chat_tools = [{"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}]
    prompt = chat_prompt(serving_tokenizer, chat_history, tools=chat_tools)
    assert "42" in serving_tokenizer.decode(prompt)  # the tool's output reached the prompt
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=8)
    assert second.usage is not None and second.usage.input_tokens == len(prompt)
    assert second.output_text == serving_tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)


def test_streaming_sends_the_response_events(served: Served) -> None:
    _, _, url = served
    events = list(
        client(url).responses.create(
            model=MODEL_NAME, input="hello", max_output_tokens=10, temperature=0, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert deltas == final.output_text
    same = client(url).responses.create(model=MODEL_NAME, input="hello", max_output_tokens=10, temperature=0)
    assert same.output_text == final.output_text


def test_a_json_schema_text_format_is_enforced(served: Served) -> None:
    _, _, url = served
    out = client(url).responses.create(
        model=MODEL_NAME,
        input="give a and b",
        text={"format": {"type": "json_schema", "name": "ab", "schema": PARAMS, "strict": True}},
        max_output_tokens=60,
        temperature=1.0,
    )
    jsonschema.validate(json.loads(out.output_text), PARAMS)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "objec"}}}},
            "text.format",
        ),
    ],
)
def test_unsupported_fields_are_400s_naming_them(served: Served, extra: dict[str, Any], param: str) -> None:
    _, _, url = served
    body: dict[str, Any] = {"input": "hi", "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client(url).responses.create(model=MODEL_NAME, **body)
    assert err.value.body["param"].startswith(param)  # type: ignore[index]


def test_a_streamed_forced_call_sends_its_arguments_events(served: Served) -> None:
    _, _, url = served
    events = list(
        client(url).responses.create(
            model=MODEL_NAME,
            input="look up a",
            tools=[TOOL],  # type: ignore[list-item]
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=60,
            temperature=1.0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.done" in kinds and kinds[-1] == "response.completed"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    [call] = [o for o in events[-1].response.output if o.type == "function_call"]  # type: ignore[union-attr]
    assert done.arguments == call.arguments and call.name == "lookup"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.arguments), PARAMS)
