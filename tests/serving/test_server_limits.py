"""Hostile input: each malformed or oversized request is a 4xx naming the field and never reaches the engine.

The server under test has small limits (`max_n` 4, `max_request_tokens` 256, `max_body_bytes` 64 KiB) over
the real built-in engine; a recording wrapper of `engine.generate_one` shows which requests reached it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from serving_cases import API_KEY, AUTH, MESSAGES, MODEL_NAME, chat_prompt, client, direct
from transformers import PreTrainedTokenizerBase

from quartet.config.errors import ConfigError
from quartet.config.loader import from_dict
from quartet.config.rollout import ServerConfig
from quartet.rollout import GenerationOutput, GenerationRequest, TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread
from quartet.serving.responses import output_from_json
from quartet.serving.text import LARGE_TEXT_CHARS

VOCAB = 512  # the tiny model's vocabulary (tokenizer and embedding table)


@pytest.fixture(scope="module")
def seen(serving_engine: TorchRolloutEngine) -> Iterator[list[GenerationRequest]]:
    """Every request that reached the engine while this module runs."""
    requests: list[GenerationRequest] = []
    original = serving_engine.generate_one

    async def recording(request: GenerationRequest) -> list[GenerationOutput]:
        requests.append(request)
        return await original(request)

    serving_engine.generate_one = recording  # type: ignore[method-assign]
    yield requests
    del serving_engine.generate_one


@pytest.fixture(scope="module")
def small(
    serving_engine: TorchRolloutEngine,
    serving_tokenizer: PreTrainedTokenizerBase,
    seen: list[GenerationRequest],
) -> Iterator[str]:
    """The base URL of a server with small limits."""
    server = OpenAIServer(
        serving_engine,
        serving_tokenizer,
        MODEL_NAME,
        api_key=API_KEY,
        max_new_tokens_default=8,
        request_timeout_s=60,
        max_n=4,
        max_request_tokens=256,
        max_body_bytes=64 * 1024,
    )
    assert server.limits.vocab_size == VOCAB
    with ServerThread(server) as thread:
        yield thread.start()


def post(url: str, path: str, body: Any, headers: dict[str, Any] | None = None) -> httpx.Response:
    kwargs: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(f"{url}/{path}", headers=AUTH if headers is None else headers, timeout=60, **kwargs)


BAD_BESIDE_A_GOOD_ONE = [
    ("quartet/generate", {"prompt_token_ids": [5, VOCAB + 7]}, "prompt_token_ids"),
    ("quartet/generate", {"prompt_token_ids": [5, 6], "sampling": {"top_k": 2**70}}, "sampling.top_k"),
    ("quartet/generate", {"prompt_token_ids": [5, 6], "sampling": {"n": 300000}}, "sampling.n"),
    (
        "quartet/generate",
        {"prompt_token_ids": [5], "sampling": {"stop_token_ids": [VOCAB]}},
        "sampling.stop_token_ids",
    ),
    ("completions", {"prompt": [1, 2, -1]}, "prompt"),
    ("completions", {"prompt": [1, 2, 10**12]}, "prompt"),
    ("completions", {"prompt": "hi", "top_k": 2**70}, "top_k"),
    ("completions", {"prompt": "hi", "seed": 2**70}, "seed"),
    ("completions", {"prompt": "hi", "temperature": 1e-300}, "temperature"),
    ("completions", {"prompt": "hi", "n": 300000, "max_tokens": 1}, "n"),
    ("chat/completions", {"messages": MESSAGES, "max_tokens": 2**40}, "max_tokens"),
    ("chat/completions", {"messages": MESSAGES, "n": 4, "max_tokens": 100}, "max_tokens"),
    ("chat/completions", {"messages": MESSAGES, "stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ("chat/completions", {"messages": MESSAGES, "presence_penalty": 3}, "presence_penalty"),
    ("chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
]


def test_bad_requests_beside_a_good_one_fail_alone_and_never_reach_the_engine(
    small: str, serving_engine: TorchRolloutEngine, seen: list[GenerationRequest]
) -> None:
    """All bad requests are sent at once with a long good one: it completes, each bad one is a 400."""
    prompt = [5, 6, 7, 8]
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=60, ignore_eos=True)
    good = {
        "prompt_token_ids": prompt,
        "sampling": {"temperature": 0, "max_new_tokens": 60, "ignore_eos": True},
    }

    async def send() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as c:
            calls = [c.post(f"{small}/quartet/generate", json=good)]
            calls += [c.post(f"{small}/{path}", json=body) for path, body, _ in BAD_BESIDE_A_GOOD_ONE]
            return list(await asyncio.gather(*calls))

    seen.clear()
    good_response, *bad_responses = asyncio.run(send())
    assert good_response.status_code == 200, good_response.text
    assert good_response.json()["outputs"][0]["token_ids"] == list(ref.token_ids)
    for (path, _, param), response in zip(BAD_BESIDE_A_GOOD_ONE, bad_responses, strict=True):
        assert response.status_code == 400, (path, param, response.text)
        assert response.json()["error"]["param"] == param, response.text
    assert [r.prompt_token_ids for r in seen] == [tuple(prompt)]  # only the good one reached the engine


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("chat/completions", b'{"messages": ' + b"[" * 2000 + b"]" * 2000 + b"}", None, "nested deeper"),
        (
            "chat/completions",
            b'{"messages": [[[[' + b"[" * 70 + b"]" * 70 + b"]]]]}",
            "messages",
            "nested deeper",
        ),
        ("completions", b'{"prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}", None, "digits"),
        ("completions", b'{"prompt": "a\\ud800b"}', "prompt", "surrogate"),
        (
            "chat/completions",
            b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
            "messages[0].content",
            "surrogate",
        ),
        ("completions", b'{"prompt": "hi", "temperature": NaN}', None, "finite"),
        ("completions", b'{"prompt": "\xff\xfe"}', None, "UTF-8"),
        ("completions", {"prompt": "hi", "frobnicate": True}, "frobnicate", "unknown"),
        (
            "completions",
            {"prompt": "hi", "stream_options": {"include_usage": True}},
            "stream_options",
            "stream",
        ),
        ("chat/completions", {"messages": MESSAGES, "n": 5}, "n", "max_n"),
        (
            "chat/completions",
            {"messages": [{"role": "user", "content": "x" * 3000}]},
            "messages",
            "characters",
        ),
        ("completions", {"prompt": "x" * 3000}, "prompt", "characters"),
        ("completions", {"prompt": list(range(250))}, "max_tokens", "max_request_tokens"),
        ("completions", {"prompt": list(range(300)), "max_tokens": 1}, "prompt", "max_request_tokens"),
        ("chat/completions", {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice", "no 'tools'"),
        ("chat/completions", {"messages": MESSAGES, "logit_bias": {"5": 10}}, "logit_bias", "not supported"),
        ("chat/completions", {"messages": MESSAGES, "store": True}, "store", "stores nothing"),
        (
            "chat/completions",
            {
                "messages": [
                    *MESSAGES,
                    {
                        "role": "assistant",
                        "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{"}}],
                    },
                ]
            },
            "messages[1].tool_calls[0].function.arguments",
            "JSON object",
        ),
        (
            "quartet/generate",
            {"prompt_token_ids": [1], "sampling": {"min_tokens": 9, "max_new_tokens": 4}},
            "sampling.min_tokens",
            "response limit",
        ),
    ],
)
def test_malformed_input_is_a_400_with_the_field(
    small: str, seen: list[GenerationRequest], path: str, body: Any, param: str | None, words: str
) -> None:
    seen.clear()
    response = post(small, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"]
    assert seen == []


def test_a_body_over_max_body_bytes_is_413(small: str) -> None:
    response = post(small, "completions", {"prompt": "hi", "user": "x" * 70_000})
    assert response.status_code == 413
    assert "max_body_bytes (65536)" in response.json()["error"]["message"]


def test_a_non_utf8_authorization_header_is_401(small: str) -> None:
    response = post(small, "completions", {"prompt": "hi"}, headers={"Authorization": b"Bearer \xff\xfe\x80"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_penalties_and_min_tokens_reach_the_engine(
    small: str, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    """OpenAI / vLLM penalty fields become `SamplingParams` fields: the answer is the engine's own."""
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    fields = {"repetition_penalty": 1.8, "frequency_penalty": 0.7, "presence_penalty": 0.4, "min_tokens": 6}
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=12, **fields)
    [plain] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=12)
    assert ref.token_ids != plain.token_ids  # the penalties change the greedy answer: a real comparison
    out = client(small).chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=12, extra_body=fields
    )
    assert out.choices[0].message.content == serving_tokenizer.decode(
        list(ref.token_ids), skip_special_tokens=True
    )


def test_top_logprobs_are_the_engines_alternatives(
    small: str, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=5, top_logprobs=3)
    assert ref.top_logprobs is not None
    out = client(small).chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=5, logprobs=True, top_logprobs=3
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == len(ref.token_ids)
    for entry, alternatives in zip(content, ref.top_logprobs, strict=True):
        assert [a.token for a in entry.top_logprobs] == [
            serving_tokenizer.decode([t]) for t, _ in alternatives
        ]
        assert [a.logprob for a in entry.top_logprobs] == pytest.approx(
            [lp for _, lp in alternatives], abs=1e-4
        )


class _GatedTokenizer:
    """The real tokenizer, whose chat rendering of prompts of at least `min_chars` characters waits until the
    test releases it (a deep copy, as the server's bulk lane makes, shares the gate)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, min_chars: int = 0) -> None:
        self.tokenizer = tokenizer
        self.min_chars = min_chars
        self.entered = threading.Event()
        self.release = threading.Event()

    def __deepcopy__(self, memo: dict[int, Any]) -> _GatedTokenizer:
        return self

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        if sum(len(m["content"] or "") for m in conversation) >= self.min_chars:
            self.entered.set()
            assert self.release.wait(60)
        return self.tokenizer.apply_chat_template(conversation, **kwargs)

    def encode(self, text: str, **kwargs: Any) -> Any:
        return self.tokenizer.encode(text, **kwargs)

    def decode(self, token_ids: Any, **kwargs: Any) -> Any:
        return self.tokenizer.decode(token_ids, **kwargs)


def test_rendering_runs_off_the_event_loop_and_is_bounded_in_time(
    serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    """While a chat prompt is being rendered, the server still answers; a render past the bound is a 400."""
    gated = _GatedTokenizer(serving_tokenizer)
    server = OpenAIServer(serving_engine, gated, MODEL_NAME, vocab_size=VOCAB, tokenize_timeout_s=2.0)
    with ServerThread(server) as thread:
        url = thread.start()
        answers: list[httpx.Response] = []
        body = {"messages": MESSAGES, "max_tokens": 3}
        chat = threading.Thread(
            target=lambda: answers.append(post(url, "chat/completions", body, headers={}))
        )
        chat.start()
        assert gated.entered.wait(30)
        assert httpx.get(f"{url}/models", timeout=30).status_code == 200  # the loop is free meanwhile
        chat.join(60)  # the render is still held: the time bound answers
        gated.release.set()
        [timed_out] = answers
        assert timed_out.status_code == 400 and timed_out.json()["error"]["code"] == "tokenizer_timeout"
        assert post(url, "chat/completions", body, headers={}).status_code == 200  # released: served again


def test_a_large_prompt_being_rendered_does_not_hold_up_small_ones(
    serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    gated = _GatedTokenizer(serving_tokenizer, min_chars=LARGE_TEXT_CHARS + 1)
    server = OpenAIServer(serving_engine, gated, MODEL_NAME, vocab_size=VOCAB)
    with ServerThread(server) as thread:
        url = thread.start()
        answers: list[httpx.Response] = []
        large = {"messages": [{"role": "user", "content": "x" * (LARGE_TEXT_CHARS + 1)}], "max_tokens": 2}
        sender = threading.Thread(
            target=lambda: answers.append(post(url, "chat/completions", large, headers={}))
        )
        sender.start()
        try:
            assert gated.entered.wait(30)
            small = post(url, "chat/completions", {"messages": MESSAGES, "max_tokens": 2}, headers={})
            assert small.status_code == 200 and answers == []  # served while the large one is still held
        finally:
            gated.release.set()
            sender.join(60)
        [answer] = answers
        assert answer.status_code < 500  # rendered once released (over the tiny model's context: a 400)


def test_openapi_document_describes_the_routes_with_the_limits(small: str) -> None:
    doc = httpx.get(small.removesuffix("/v1") + "/openapi.json", headers=AUTH, timeout=30).json()
    assert set(doc["paths"]) == {
        "/v1/models",
        "/v1/models/{model_id}",
        "/v1/responses",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/quartet/generate",
    }
    chat = doc["components"]["schemas"]["ChatRequest"]
    assert chat["properties"]["n"]["maximum"] == 4 and chat["additionalProperties"] is False
    assert (
        doc["components"]["schemas"]["TokenRequest"]["properties"]["prompt_token_ids"]["items"]["maximum"]
        == VOCAB - 1
    )
    assert json.dumps(doc)  # plain JSON


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_n": 0}, "max_n"),
        ({"max_request_tokens": 1}, "max_request_tokens"),
        ({"max_body_bytes": 10}, "max_body_bytes"),
    ],
)
def test_server_config_limits_are_range_checked(overrides: dict[str, int], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ServerConfig(**overrides)


def test_server_config_limits_load_from_yaml_keys() -> None:
    cfg = from_dict(ServerConfig, {"max_n": 3, "max_request_tokens": 1000, "max_body_bytes": 4096})
    assert (cfg.max_n, cfg.max_request_tokens, cfg.max_body_bytes) == (3, 1000, 4096)


def test_token_endpoint_returns_top_logprobs_that_read_back(
    small: str, serving_engine: TorchRolloutEngine
) -> None:
    [ref] = direct(serving_engine, [5, 6, 7], temperature=0.0, max_new_tokens=4, top_logprobs=2)
    body = {
        "prompt_token_ids": [5, 6, 7],
        "sampling": {"temperature": 0, "max_new_tokens": 4, "top_logprobs": 2},
    }
    response = post(small, "quartet/generate", body)
    assert response.status_code == 200, response.text
    [out] = response.json()["outputs"]
    back = output_from_json(out, "r")
    assert ref.top_logprobs is not None and back.top_logprobs is not None
    assert [[t for t, _ in e] for e in back.top_logprobs] == [[t for t, _ in e] for e in ref.top_logprobs]
    assert [lp for e in back.top_logprobs for _, lp in e] == pytest.approx(
        [lp for e in ref.top_logprobs for _, lp in e], abs=1e-4
    )


def test_completions_logprobs_k_gives_k_alternatives(
    small: str, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    [ref] = direct(serving_engine, [5, 6, 7], temperature=0.0, max_new_tokens=4, top_logprobs=2)
    assert ref.top_logprobs is not None
    out = client(small).completions.create(
        model=MODEL_NAME, prompt=[5, 6, 7], temperature=0, max_tokens=4, logprobs=2
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.top_logprobs is not None
    expected = [{serving_tokenizer.decode([t]): lp for t, lp in e} for e in ref.top_logprobs]
    assert [list(e) for e in logprobs.top_logprobs] == [list(e) for e in expected]
    assert [v for e in logprobs.top_logprobs for v in e.values()] == pytest.approx(
        [v for e in expected for v in e.values()], abs=1e-4
    )
