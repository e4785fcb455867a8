"""The OpenAI-compatible server over the real built-in engine, driven by the official `openai` client.

Every answer is checked against a generation done directly through the engine on the same prompt ids.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest
from serving_cases import API_KEY, AUTH, MESSAGES, MODEL_NAME, chat_prompt, client, direct
from transformers import PreTrainedTokenizerBase

from quartet.rollout import (
    FinishReason,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    TorchRolloutEngine,
)
from quartet.serving import (
    OpenAIServer,
    ReplicaTimeoutError,
    RequestScheduler,
    ServerAsleepError,
    ServerThread,
)
from quartet.serving.text import decode_response

Served = tuple[OpenAIServer, ServerThread, str]


def test_chat_greedy_matches_the_engine(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=20)
    expected = serving_tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    assert len(set(ref.token_ids)) > 3  # a varied response: a real comparison

    out = client(url).chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=20, logprobs=True
    )
    [choice] = out.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected
    assert choice.finish_reason == ref.finish_reason.value
    assert out.object == "chat.completion" and out.model == MODEL_NAME and out.id.startswith("chatcmpl-")
    assert out.usage is not None
    assert out.usage.prompt_tokens == len(prompt)
    assert out.usage.completion_tokens == len(ref.token_ids)
    assert out.usage.total_tokens == len(prompt) + len(ref.token_ids)
    assert choice.logprobs is not None and choice.logprobs.content is not None
    assert ref.logprobs is not None
    assert [c.logprob for c in choice.logprobs.content] == pytest.approx(ref.logprobs, abs=1e-4)
    assert [c.token for c in choice.logprobs.content] == [
        serving_tokenizer.decode([t]) for t in ref.token_ids
    ]


def test_chat_max_completion_tokens_stop_string_and_tools(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    prompt = chat_prompt(serving_tokenizer, MESSAGES, tools=tools)
    assert len(prompt) > len(chat_prompt(serving_tokenizer, MESSAGES)) + 10  # the tools are in the prompt
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=24)
    full = serving_tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    # a stop string of two plain characters from the second half (no partial UTF-8 from byte tokens)
    k = next(
        i
        for i in range(len(full) // 2, len(full) - 1)
        if full[i : i + 2].isascii() and full[i : i + 2].isalnum()
    )
    stop = full[k : k + 2]

    c = client(url)
    out = c.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=tools,
        temperature=0,
        max_completion_tokens=24,
    )
    assert out.choices[0].message.content == full
    assert out.usage is not None and out.usage.prompt_tokens == len(prompt)
    cut = c.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        tools=tools,
        temperature=0,
        max_tokens=24,
        stop=[stop],
    )
    assert cut.choices[0].message.content == full[: full.find(stop)]  # cut before the stop string
    assert cut.choices[0].finish_reason == "stop"


def test_chat_n_samples_match_seeded_engine_samples(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    refs = direct(serving_engine, prompt, temperature=1.0, n=2, seed=7, max_new_tokens=12)
    out = client(url).chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, temperature=1.0, n=2, seed=7, max_tokens=12
    )
    assert [c.index for c in out.choices] == [0, 1]
    texts = [c.message.content for c in out.choices]
    assert texts == [serving_tokenizer.decode(list(r.token_ids), skip_special_tokens=True) for r in refs]
    assert texts[0] != texts[1]  # two different samples
    assert out.usage is not None and out.usage.completion_tokens == sum(len(r.token_ids) for r in refs)


def test_models_list(served: Served) -> None:
    assert [m.id for m in client(served[2]).models.list()] == [MODEL_NAME]


def test_completions_text_and_token_prompts(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    ids = list(serving_tokenizer.encode("the answer is"))
    [ref] = direct(serving_engine, ids, temperature=0.0, max_new_tokens=12)
    expected = serving_tokenizer.decode(list(ref.token_ids), skip_special_tokens=True)
    c = client(url)
    by_text = c.completions.create(
        model=MODEL_NAME, prompt="the answer is", temperature=0, max_tokens=12, logprobs=0
    )
    by_ids = c.completions.create(model=MODEL_NAME, prompt=ids, temperature=0, max_tokens=12)
    assert by_text.choices[0].text == expected == by_ids.choices[0].text
    assert by_text.object == "text_completion"
    assert by_text.usage is not None and by_text.usage.prompt_tokens == len(ids)
    assert by_text.usage.completion_tokens == len(ref.token_ids)
    logprobs = by_text.choices[0].logprobs
    assert logprobs is not None and ref.logprobs is not None
    assert logprobs.token_logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    assert by_ids.choices[0].logprobs is None


def test_stop_token_ids_from_extra_body_and_special_tokens_skipped(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    ids = list(serving_tokenizer.encode("hello"))
    [ref] = direct(serving_engine, ids, temperature=0.0, max_new_tokens=12)
    stop_id = ref.token_ids[5]
    end = ref.token_ids.index(stop_id) + 1
    out = client(served[2]).completions.create(
        model=MODEL_NAME,
        prompt="hello",
        temperature=0,
        max_tokens=12,
        extra_body={"stop_token_ids": [stop_id]},
    )
    assert out.choices[0].finish_reason == "stop"
    assert out.choices[0].text == serving_tokenizer.decode(
        list(ref.token_ids[:end]), skip_special_tokens=True
    )
    assert out.usage is not None and out.usage.completion_tokens == end  # the stop token counts
    # the end-of-turn token the engine keeps in the ids is not part of the text
    eos = serving_tokenizer.eos_token_id
    ended = GenerationOutput("r", 0, (*ref.token_ids[:4], eos), None, FinishReason.STOP, eos)
    assert "<|im_end|>" in serving_tokenizer.decode(list(ended.token_ids))
    assert decode_response(serving_tokenizer, ended) == serving_tokenizer.decode(
        list(ref.token_ids[:4]), skip_special_tokens=True
    )


def test_wrong_or_missing_api_key_is_401(served: Served) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(served[2], api_key="wrong").models.list()
    response = httpx.post(f"{served[2]}/chat/completions", json={"messages": MESSAGES})
    assert response.status_code == 401
    assert "API key" in response.json()["error"]["message"]


def test_chat_stream_sends_the_response_as_chunks_with_usage_last(
    served: Served, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    c = client(served[2])
    whole = c.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, temperature=0, max_tokens=90)
    stream = c.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        temperature=0,
        max_tokens=90,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert deltas[0].role == "assistant"
    text = "".join(d.content or "" for d in deltas)
    assert text == whole.choices[0].message.content and len(text) > 0
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage  # usage in the last chunk only
    assert all(ch.usage is None for ch in chunks[:-1])


def test_completions_stream_ends_with_done_and_matches_the_whole_response(served: Served) -> None:
    body = {"model": MODEL_NAME, "prompt": "hello", "temperature": 0, "max_tokens": 12, "n": 2, "seed": 3}
    whole = httpx.post(f"{served[2]}/completions", json=body, headers=AUTH, timeout=60).json()
    response = httpx.post(f"{served[2]}/completions", json={**body, "stream": True}, headers=AUTH, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = ["", ""]
    for chunk in chunks:
        [choice] = chunk["choices"]
        texts[choice["index"]] += choice["text"]
    assert texts == [ch["text"] for ch in whole["choices"]]
    assert "usage" not in chunks[-1]  # no include_usage: no usage chunk
    out = client(served[2]).completions.create(
        model=MODEL_NAME, prompt="hello", temperature=0, max_tokens=12, stream=True
    )
    assert "".join(ch.choices[0].text for ch in out) == whole["choices"][0]["text"]


@pytest.mark.parametrize(
    ("path", "body", "param", "words"),
    [
        ("chat/completions", b"{not json", None, "not valid JSON"),
        ("chat/completions", b"[1, 2]", None, "JSON object"),
        ("chat/completions", {"model": MODEL_NAME}, "messages", "'messages' is required"),
        ("chat/completions", {"messages": "hi"}, "messages", "non-empty list"),
        ("chat/completions", {"messages": [{"content": "hi"}]}, "messages[0].role", "must be a string"),
        ("chat/completions", {"messages": MESSAGES, "temperature": "hot"}, "temperature", "finite number"),
        ("chat/completions", {"messages": MESSAGES, "top_p": 0}, "top_p", "(0, 1]"),
        ("chat/completions", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "[1, 2**31)"),
        ("chat/completions", {"messages": MESSAGES, "n": True}, "n", "integer"),
        ("chat/completions", {"messages": MESSAGES, "top_logprobs": 3}, "top_logprobs", "needs 'logprobs'"),
        ("chat/completions", {"messages": MESSAGES, "frobnicate": 1}, "frobnicate", "unknown"),
        ("chat/completions", {"messages": MESSAGES, "temprature": 1}, "temprature", "did you mean"),
        ("chat/completions", {"messages": MESSAGES, "stream_options": {}}, "stream_options", "stream"),
        ("completions", {"prompt": 5}, "prompt", "string or a list of token ids"),
        ("completions", {"prompt": "hi", "logprobs": 9}, "logprobs", "[0, 5]"),
        ("quartet/generate", {"sampling": {}}, "prompt_token_ids", "required"),
        ("quartet/generate", {"prompt_token_ids": [1, -2]}, "prompt_token_ids", "token ids"),
        (
            "quartet/generate",
            {"prompt_token_ids": [1], "sampling": {"temprature": 0}},
            "sampling.temprature",
            "unknown",
        ),
        ("quartet/generate", {"prompt_token_ids": [1], "sampling": {"stop": [3]}}, "sampling.stop", "string"),
    ],
)
def test_malformed_bodies_are_400_naming_the_field(
    served: Served, path: str, body: Any, param: str | None, words: str
) -> None:
    headers = AUTH
    if isinstance(body, bytes):
        response = httpx.post(f"{served[2]}/{path}", content=body, headers=headers)
    else:
        response = httpx.post(f"{served[2]}/{path}", json=body, headers=headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert words in error["message"]


def test_unknown_model_and_path_are_404(served: Served) -> None:
    headers = AUTH
    response = httpx.post(
        f"{served[2]}/chat/completions", json={"model": "gpt-5", "messages": MESSAGES}, headers=headers
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert httpx.get(f"{served[2]}/nowhere", headers=headers).status_code == 404


def test_token_endpoint_and_in_process_call_match_the_engine(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    server, thread, url = served
    prompt = chat_prompt(serving_tokenizer, MESSAGES)
    [ref] = direct(serving_engine, prompt, temperature=0.0, max_new_tokens=10, stop_token_ids=(7,))
    body = {
        "prompt_token_ids": prompt,
        "sampling": {"temperature": 0, "max_new_tokens": 10, "stop_token_ids": [7]},
    }
    response = httpx.post(f"{url}/quartet/generate", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    [out] = response.json()["outputs"]
    assert out["token_ids"] == list(ref.token_ids)
    assert out["logprobs"] == pytest.approx(ref.logprobs, abs=1e-4)
    assert out["finish_reason"] == ref.finish_reason.value
    sampling = SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(7,))
    [local] = thread.call(server.generate_tokens(prompt, sampling))
    assert local.token_ids == ref.token_ids


def test_concurrent_requests_share_the_batch(
    served: Served, serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> None:
    _, _, url = served
    questions = ["What is 12 + 7?", "hello", "please solve 3 * 4", "thanks: 5 - 2"]
    conversations = [[{"role": "user", "content": q}] for q in questions]
    prompts = [chat_prompt(serving_tokenizer, m) for m in conversations]
    refs = serving_engine.generate(
        [GenerationRequest(tuple(p), SamplingParams(temperature=0.0, max_new_tokens=16)) for p in prompts]
    )
    expected = [serving_tokenizer.decode(list(r[0].token_ids), skip_special_tokens=True) for r in refs]

    async def chats() -> list[str | None]:
        async with openai.AsyncOpenAI(base_url=url, api_key=API_KEY, max_retries=0) as c:
            outs = await asyncio.gather(
                *(
                    c.chat.completions.create(model=MODEL_NAME, messages=m, temperature=0, max_tokens=16)
                    for m in conversations
                )
            )
        return [o.choices[0].message.content for o in outs]

    assert asyncio.run(chats()) == expected  # concurrent answers are not mixed up

    async def tokens() -> list[dict[str, Any]]:
        body = {"sampling": {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}}
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as c:
            rs = await asyncio.gather(
                *(c.post(f"{url}/quartet/generate", json={**body, "prompt_token_ids": p}) for p in prompts)
            )
        return [r.json()["outputs"][0] for r in rs]

    outs = asyncio.run(tokens())
    assert all(len(o["token_ids"]) == 24 for o in outs)
    # all four were decoding together: each was admitted before any of them finished
    assert max(o["first_step"] for o in outs) < min(o["finish_step"] for o in outs)


def test_sleep_refuses_with_503_until_wake(served: Served, serving_engine: TorchRolloutEngine) -> None:
    server, thread, url = served
    c = client(url)
    c.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)  # the KV cache exists
    thread.sleep()
    try:
        assert server.asleep and serving_engine.kv_cache_bytes == 0  # the engine itself slept
        with pytest.raises(openai.InternalServerError, match="asleep") as info:
            c.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
        assert info.value.status_code == 503
        with pytest.raises(ServerAsleepError):
            thread.call(server.generate_tokens([1, 2, 3], SamplingParams(max_new_tokens=2)))
    finally:
        thread.wake()
    assert not server.asleep
    out = c.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, max_tokens=4)
    assert out.usage is not None and out.usage.completion_tokens >= 1


def test_sleep_waits_for_requests_in_flight(served: Served, serving_engine: TorchRolloutEngine) -> None:
    server, thread, _ = served
    sampling = SamplingParams(max_new_tokens=200, ignore_eos=True)

    async def sleep_during_a_request() -> tuple[bool, int]:
        running = asyncio.ensure_future(server.generate_tokens([5, 6, 7], sampling))
        await asyncio.sleep(0)  # the request enters the engine
        assert server.in_flight == 1 and not running.done()
        await server.sleep()
        return running.done(), len((await running)[0].token_ids)

    try:
        done, length = thread.call(sleep_during_a_request())
        assert done and length == 200  # sleep returned only after the request finished, in full
        assert serving_engine.kv_cache_bytes == 0
    finally:
        thread.wake()


def test_request_timeout_is_504_and_aborts_in_the_engine(
    serving_engine: TorchRolloutEngine,
    serving_tokenizer: PreTrainedTokenizerBase,
    served: Served,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    finished: list[GenerationOutput] = []  # what the engine returned for the abandoned request
    original = serving_engine.generate_one

    async def recording(request: GenerationRequest) -> list[GenerationOutput]:
        outs = await original(request)
        finished.extend(outs)
        return outs

    monkeypatch.setattr(serving_engine, "generate_one", recording)
    server = OpenAIServer(serving_engine, serving_tokenizer, MODEL_NAME, request_timeout_s=0.2)
    with ServerThread(server) as thread:
        url = thread.start()
        body = {"prompt_token_ids": [5, 6, 7], "sampling": {"max_new_tokens": 500, "ignore_eos": True}}
        response = httpx.post(f"{url}/quartet/generate", json=body, timeout=60)
        assert response.status_code == 504
        assert "request_timeout_s" in response.json()["error"]["message"]
        deadline = time.monotonic() + 10
        while server.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.in_flight == 0
    [aborted] = finished
    assert aborted.finish_reason is FinishReason.ABORT and len(aborted.token_ids) < 500  # stopped early
    # the engine is still healthy for the other server
    out = client(served[2]).completions.create(model=MODEL_NAME, prompt="hello", max_tokens=3)
    assert out.usage is not None and out.usage.completion_tokens >= 1


def test_an_in_process_caller_giving_up_aborts_without_harming_the_engine(
    served: Served, serving_engine: TorchRolloutEngine
) -> None:
    server = served[0]
    scheduler = RequestScheduler([server], 1, queue_timeout_s=1.0, request_timeout_s=0.1)
    sampling = SamplingParams(max_new_tokens=500, ignore_eos=True)
    # the scheduler cancels the server's call, then asyncio.run closes the caller's loop at once
    with pytest.raises(ReplicaTimeoutError):
        asyncio.run(scheduler.generate_tokens([5, 6, 7], sampling))
    deadline = time.monotonic() + 10
    while server.in_flight and time.monotonic() < deadline:  # aborted in the engine, not left running
        time.sleep(0.01)
    assert server.in_flight == 0
    [out] = direct(serving_engine, [5, 6, 7], max_new_tokens=3)  # the engine thread is alive
    assert len(out.token_ids) == 3 or out.finish_reason is FinishReason.STOP
