"""Fuzzing the server: no request body, valid or not, gets a 5xx (a 5xx is a bug; malformed input is a 4xx).

Two generators, both over the real built-in engine behind a server with small limits (so valid requests
finish in a few tokens):
- hypothesis bodies built from the fields each route knows, each drawn either plausible or as any JSON
  value (huge and negative integers, floats, strings with surrogates, nested lists and objects), plus raw
  bytes;
- schemathesis over the OpenAPI document the server serves (`GET /openapi.json`): positive cases (valid
  by the schema) and negative ones (each breaking a rule of the schema), >= 500 examples per route.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving_cases import API_KEY, AUTH, MODEL_NAME
from transformers import PreTrainedTokenizerBase

from quartet.rollout import TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread

ROUTES = ("chat/completions", "completions", "quartet/generate", "responses")


def fuzz_settings(examples: int) -> settings:
    """Deterministic runs (a CI failure reproduces), no deadline (the engine shares a busy CPU)."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def fuzz_url(serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase) -> Iterator[str]:
    server = OpenAIServer(
        serving_engine,
        serving_tokenizer,
        MODEL_NAME,
        api_key=API_KEY,
        max_new_tokens_default=2,
        request_timeout_s=60,
        max_n=2,
        max_request_tokens=32,
        max_body_bytes=64 * 1024,
    )
    with ServerThread(server) as thread:
        yield thread.start()


class _Errors(logging.Handler):
    """Records of the serving loggers at WARNING or above, or with a traceback (a client hang-up is INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING or record.exc_info:
            self.records.append(record)


@pytest.fixture(autouse=True)
def no_server_error_logged() -> Iterator[None]:
    """Every fuzz test also asserts the server logged no error: a 500 the client never saw (it hung up
    first) still leaves its traceback here."""
    handler = _Errors()
    logger = logging.getLogger("quartet.serving")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not handler.records, [r.getMessage() for r in handler.records[:5]]


def _check(response: httpx.Response, seen: Counter[int]) -> None:
    seen[response.status_code] += 1
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(codec=None), max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
SMALL_INT = st.integers(min_value=-3, max_value=600)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "system", "assistant", "tool", "bogus"]),
        "content": st.text(max_size=20),
    }
)
PLAUSIBLE: dict[str, st.SearchStrategy[Any]] = {
    "model": st.sampled_from([MODEL_NAME, "other"]),
    "messages": st.lists(MESSAGE, max_size=3),
    "prompt": st.text(max_size=20) | st.lists(SMALL_INT, max_size=6),
    "prompt_token_ids": st.lists(SMALL_INT, max_size=6),
    "sampling": st.dictionaries(
        st.sampled_from(["temperature", "top_k", "max_new_tokens", "n", "seed", "stop", "min_tokens"]),
        SMALL_INT | st.floats(min_value=-1, max_value=3),
        max_size=3,
    ),
    "temperature": st.floats(min_value=-1, max_value=3),
    "top_p": st.floats(min_value=-0.5, max_value=1.5),
    "top_k": SMALL_INT,
    "n": SMALL_INT,
    "max_tokens": SMALL_INT,
    "seed": st.integers(),
    "stop": st.text(max_size=4) | st.lists(st.text(max_size=4), max_size=3),
    "stop_token_ids": st.lists(SMALL_INT, max_size=3),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "logprobs": st.booleans() | SMALL_INT,
    "top_logprobs": SMALL_INT,
    "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": JSON}), max_size=2),
    "tool_choice": st.sampled_from(["auto", "none", "required"]),
    "presence_penalty": st.floats(min_value=-3, max_value=3),
    "repetition_penalty": st.floats(min_value=-1, max_value=3),
    "min_tokens": SMALL_INT,
    "response_format": st.sampled_from(
        [
            {"type": "text"},
            {"type": "json_object"},
            {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}},
        ]
    ),
    "input": st.text(max_size=20) | st.lists(MESSAGE, max_size=2),
    "instructions": st.text(max_size=10),
    "max_output_tokens": SMALL_INT,
    "parallel_tool_calls": st.booleans(),
}
_RESPONSES_ONLY = ("input", "instructions", "max_output_tokens")
_OTHERS = ("prompt", "prompt_token_ids", "sampling", *_RESPONSES_ONLY)


ROUTE_FIELDS = {
    "chat/completions": [k for k in PLAUSIBLE if k not in _OTHERS],
    "completions": [
        k
        for k in PLAUSIBLE
        if k not in ("messages", "tools", "response_format", "parallel_tool_calls", *_OTHERS[1:])
    ],
    "quartet/generate": ["prompt_token_ids", "sampling"],
    "responses": [
        *_RESPONSES_ONLY,
        *("tools", "tool_choice", "temperature", "top_p", "stream", "model", "parallel_tool_calls"),
    ],
}
_VALID_OPTIONAL = {
    "temperature": st.floats(min_value=0, max_value=2),
    "top_k": st.integers(0, 600),
    "n": st.integers(1, 2),
    "seed": st.integers(0, 2**40),
    "stream": st.booleans(),
    "stop": st.text(min_size=1, max_size=3),
    "frequency_penalty": st.floats(min_value=-2, max_value=2),
}
VALID = {
    "chat/completions": st.fixed_dictionaries(
        {"messages": st.lists(MESSAGE.filter(lambda m: m["role"] == "user"), min_size=1, max_size=2)},
        optional={**_VALID_OPTIONAL, "max_tokens": st.integers(1, 6), "logprobs": st.booleans()},
    ),
    "completions": st.fixed_dictionaries(
        {"prompt": st.text(min_size=1, max_size=20) | st.lists(st.integers(0, 511), min_size=1, max_size=8)},
        optional={**_VALID_OPTIONAL, "max_tokens": st.integers(1, 6), "logprobs": st.integers(0, 5)},
    ),
    "quartet/generate": st.fixed_dictionaries(
        {"prompt_token_ids": st.lists(st.integers(0, 511), min_size=1, max_size=8)},
        optional={"sampling": st.fixed_dictionaries({"max_new_tokens": st.integers(1, 6)})},
    ),
    "responses": st.fixed_dictionaries(
        {"input": st.text(min_size=1, max_size=20)},
        optional={
            "temperature": _VALID_OPTIONAL["temperature"],
            "stream": st.booleans(),
            "max_output_tokens": st.integers(1, 6),
            "instructions": st.text(max_size=10),
        },
    ),
}
"""Bodies valid but for the odd value, so that many requests reach the engine."""


JSON_HEADERS = {"Content-Type": "application/json"}


def _bodies(route: str) -> st.SearchStrategy[dict[str, Any]]:
    names = ROUTE_FIELDS[route]
    fields = {name: PLAUSIBLE[name] | JSON for name in names}
    return (
        VALID[route]
        | st.fixed_dictionaries({}, optional=fields)
        | st.dictionaries(st.sampled_from(names) | st.text(max_size=8), JSON)
    )


@pytest.mark.parametrize("route", ROUTES)
def test_hypothesis_bodies_never_get_a_server_error(fuzz_url: str, route: str) -> None:
    seen: Counter[int] = Counter()
    with httpx.Client(base_url=fuzz_url, headers=AUTH, timeout=60) as http:

        @fuzz_settings(300)
        @given(body=_bodies(route) | st.binary(max_size=64))
        def fuzz(body: dict[str, Any] | bytes) -> None:
            if isinstance(body, bytes):
                _check(http.post(f"/{route}", content=body), seen)
            else:  # encoded here: escapes (a lone surrogate as \\ud800) reach the server; httpx refuses
                _check(http.post(f"/{route}", content=json.dumps(body), headers=JSON_HEADERS), seen)

        fuzz()
    assert sum(seen.values()) >= 300
    assert seen[200] > 0 and seen[400] > 0  # both kinds were exercised


def _fuzz_operation(http: httpx.Client, root: str, operation: Any, examples: int) -> Counter[int]:
    """Status counts of `examples` positive and negative schemathesis cases of one operation."""
    from schemathesis import GenerationMode

    seen: Counter[int] = Counter()
    cases = st.one_of(
        operation.as_strategy(generation_mode=GenerationMode.POSITIVE),
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE),
    )

    @fuzz_settings(examples)
    @given(case=cases)
    def fuzz(case: Any) -> None:
        kwargs = case.as_transport_kwargs(base_url=root, headers=AUTH)
        body = kwargs.get("json")
        content = kwargs.get("data") if body is None else None
        response = http.request(
            kwargs["method"],
            kwargs["url"],
            params=kwargs.get("params") or None,
            headers={**kwargs.get("headers", {}), **AUTH},
            json=body,
            content=content if isinstance(content, bytes | str) else None,
        )
        _check(response, seen)

    fuzz()
    return seen


def _bounded_arrays(node: Any) -> Any:
    """The document with `maxItems: 4` on arrays that have no bound: generating long nested message lists
    is what makes chat cases slow (~0.1 s each), and the server's own limits are tested elsewhere."""
    if isinstance(node, dict):
        bounded = {k: _bounded_arrays(v) for k, v in node.items()}
        if bounded.get("type") == "array" and "maxItems" not in bounded:
            bounded["maxItems"] = 4
        return bounded
    if isinstance(node, list):
        return [_bounded_arrays(v) for v in node]
    return node


@pytest.mark.slow
@pytest.mark.parametrize(
    ("route", "method", "examples"), [*((r, "POST", 500) for r in ROUTES), ("models", "GET", 20)]
)
def test_schemathesis_over_the_served_schema_finds_no_server_error(
    fuzz_url: str, route: str, method: str, examples: int
) -> None:
    """>= 500 positive and negative examples per POST route of `/openapi.json`; every answer below 500."""
    schemathesis = pytest.importorskip("schemathesis")
    root = fuzz_url.removesuffix("/v1")
    document = httpx.get(f"{root}/openapi.json", headers=AUTH, timeout=30).json()
    operation = schemathesis.openapi.from_dict(_bounded_arrays(document))[f"/v1/{route}"][method]
    with httpx.Client(timeout=60) as http:
        seen = _fuzz_operation(http, root, operation, examples)
    logging.getLogger(__name__).info("schemathesis %s: %s", route, dict(seen))  # the figures, with -o log_cli
    assert sum(seen.values()) >= examples
    assert seen[200] > 0
    if method == "POST":
        assert seen[400] > 0  # the negative cases were refused
