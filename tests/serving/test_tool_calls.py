"""Tool calls: Hermes blocks in the output become `message.tool_calls`; tool-call history is decoded.

Two layers:
- the response layer with the real tokenizer, on outputs whose ids are the Hermes text encoded (the tags are
  special tokens of this tokenizer, so a plain `skip_special_tokens` decode loses them);
- a full tool loop through HTTP with the official client over the real built-in engine. A random tiny model
  never writes a tool call, so the test first trains a copy of the tiny model for ~100 Adam steps on the two
  turns of this conversation (the call after the question, the answer after the tool's result; loss on the
  response tokens only), until greedy decoding reproduces both. Its outputs are then forced by its weights
  alone: the server, engine and client are the real ones, and the second turn is only reproduced when the
  server renders the history exactly as the training prompt was rendered (arguments decoded, no double
  encoding).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from serving_cases import MESSAGES, MODEL_NAME, client
from transformers import PreTrainedTokenizerBase

from quartet.models.loading import load_causal_lm
from quartet.rollout import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    TorchRolloutEngine,
)
from quartet.serving import OpenAIServer, ServerThread
from quartet.serving.responses import chat_response
from quartet.serving.streaming import chat_chunks
from quartet.serving.text import tag_token_ids
from quartet.serving.tool_calls import HERMES_TAGS, parse_assistant_turn

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "a + b",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CALL = {"name": "add", "arguments": {"a": 12, "b": 7}}
CALL_TEXT = "<tool_call>\n" + json.dumps(CALL) + "\n</tool_call>"
ANSWER = "12 + 7 = 19."


def _history(call_id: str, arguments: Any) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}
    return [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "19"},
    ]


def _render(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[int]:
    ids = tok.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return [int(t) for t in ids]


def _output(ids: list[int], reason: FinishReason = FinishReason.STOP) -> GenerationOutput:
    return GenerationOutput("r", 0, tuple(ids), None, reason, ids[-1])


def test_hermes_output_becomes_tool_calls_with_the_real_tokenizer(
    serving_tokenizer: PreTrainedTokenizerBase,
) -> None:
    tags = tag_token_ids(serving_tokenizer, HERMES_TAGS)
    assert set(tags.values()) == set(HERMES_TAGS)  # both tags are single (special) tokens here
    ids = serving_tokenizer.encode("Let me add. " + CALL_TEXT) + [serving_tokenizer.eos_token_id]
    plain = chat_response(MODEL_NAME, 3, [_output(ids)], serving_tokenizer, False)
    assert "<tool_call>" not in plain["choices"][0]["message"]["content"]  # why tags must be kept

    answer = chat_response(MODEL_NAME, 3, [_output(ids)], serving_tokenizer, False, tags)
    [choice] = answer["choices"]
    [call] = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me add."
    assert call["type"] == "function" and call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["function"]["name"] == "add"
    assert json.loads(call["function"]["arguments"]) == CALL["arguments"]  # a JSON string, as OpenAI sends

    cut = chat_response(
        MODEL_NAME, 3, [_output(ids[:-1], FinishReason.LENGTH)], serving_tokenizer, False, tags
    )
    assert cut["choices"][0]["finish_reason"] == "length"  # cut by the limit: not a finished call turn

    deltas = [c["choices"][0]["delta"] for c in chat_chunks(answer, False) if c["choices"]]
    assert [d["tool_calls"][0]["function"] for d in deltas if "tool_calls" in d] == [call["function"]]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>{"name": "add"',
        '<tool_call>{"arguments": {}}</tool_call>',
        "no call at all",
    ],
)
def test_malformed_or_absent_calls_leave_the_text_as_written(text: str) -> None:
    turn = parse_assistant_turn(text)
    assert turn.tool_calls == [] and turn.content == text


def test_history_arguments_are_decoded_not_double_encoded(
    served: tuple[OpenAIServer, ServerThread, str], serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    as_string = _history("call_1", json.dumps(CALL["arguments"]))
    expected = _render(serving_tokenizer, _history("call_1", CALL["arguments"]))
    assert _render(serving_tokenizer, as_string) != expected  # rendering the string as is would differ
    out = client(served[2]).chat.completions.create(
        model=MODEL_NAME,
        messages=as_string,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=2,
    )
    assert out.usage is not None and out.usage.prompt_tokens == len(expected)


@pytest.fixture(scope="module")
def tool_server(tiny_model_dir: Path, serving_tokenizer: PreTrainedTokenizerBase) -> Iterator[str]:
    """A server over a copy of the tiny model trained to call `add` and then answer (module docstring)."""
    tok = serving_tokenizer
    eos = tok.eos_token_id
    turns = [
        (_render(tok, MESSAGES), tok.encode(CALL_TEXT) + [eos]),
        (_render(tok, _history("call_1", CALL["arguments"])), tok.encode(ANSWER) + [eos]),
    ]
    model = load_causal_lm(tiny_model_dir)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and the result does not depend on load
    try:
        torch.manual_seed(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(400):
            total = 0.0
            for prompt, target in turns:
                labels = torch.tensor([[-100] * len(prompt) + target])
                loss = model(input_ids=torch.tensor([prompt + target]), labels=labels).loss
                loss.backward()
                total += float(loss.detach())
            optimizer.step()
            optimizer.zero_grad()
            if total < 0.01:
                break
    finally:
        torch.set_num_threads(threads)
    model.train(False)
    engine = TorchRolloutEngine(model, tok, max_num_seqs=2, num_threads=1)
    for prompt, target in turns:  # the engine reproduces both turns before the server is tested
        [out] = engine.generate(
            [GenerationRequest(tuple(prompt), SamplingParams(temperature=0.0, max_new_tokens=64))]
        )[0]
        assert list(out.token_ids) == target, (tok.decode(list(out.token_ids)), total)
    try:
        with ServerThread(OpenAIServer(engine, tok, MODEL_NAME, max_new_tokens_default=64)) as thread:
            yield thread.start()
    finally:
        engine.shutdown()


def test_a_full_tool_loop_with_the_official_client(tool_server: str) -> None:
    c = client(tool_server)
    first = c.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, tools=TOOLS, temperature=0)  # type: ignore[arg-type]
    [choice] = first.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "add" and json.loads(call.function.arguments) == CALL["arguments"]

    history = [
        *MESSAGES,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "19"},
    ]
    final = c.chat.completions.create(model=MODEL_NAME, messages=history, tools=TOOLS, temperature=0)  # type: ignore[arg-type]
    assert final.choices[0].finish_reason == "stop"
    assert final.choices[0].message.content == ANSWER and not final.choices[0].message.tool_calls

    stream = c.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0,
        stream=True,
    )
    chunks = [ch.choices[0] for ch in stream if ch.choices]
    streamed = [tc for ch in chunks for tc in ch.delta.tool_calls or []]
    assert [(tc.index, tc.function.name) for tc in streamed] == [(0, "add")]  # type: ignore[union-attr]
    assert json.loads(streamed[0].function.arguments) == CALL["arguments"]  # type: ignore[union-attr, arg-type]
    assert chunks[-1].finish_reason == "tool_calls"

    no_tools = c.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
        temperature=0,
    )
    assert not no_tools.choices[0].message.tool_calls and no_tools.choices[0].finish_reason == "stop"
