"""The tokenizer side of the server: chat rendering, prompt encoding, and decoding of responses.

The server only ever hands the engine token ids, so every text <-> ids step lives here:

- chat messages are rendered with the tokenizer's own chat template (`apply_chat_template` with
  `add_generation_prompt=True`), `tools` passed through to it, exactly as a trainer renders prompts;
- response text is decoded with special tokens skipped (the end-of-turn token and tool-call tags that are
  special tokens disappear, as in vLLM's text output); a response ended by a stop *string* is cut before
  that string, as OpenAI documents, while its token ids and usage still count every generated token;
- the text of one token (for log-prob entries) is that token decoded alone.

- a chat response with tools is decoded so that tool-call tags survive even where they are special tokens
  (`decode_keeping`): the text between them is decoded with special tokens skipped, the tags themselves
  are put back, so the Hermes parser sees `<tool_call>...</tool_call>`.

`TokenizerWorker` runs all of these off the event loop on one thread of its own: tokenizing a long prompt
costs seconds (a 10 MB chat body: 26 s) and would stall every other request, and a Hugging Face fast
tokenizer must not be entered from several threads at once (it can fail with "Already borrowed"), so one
thread serialises them. Each call is bounded in time (`timeout_s`, a 400 after it); the thread cannot be
interrupted, so the size bounds in `limits` (checked before any call) are what keeps a call short, and the
time bound keeps a request from waiting forever behind others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from quartet.rollout.types import GenerationOutput
from quartet.serving.errors import ApiError

__all__ = [
    "LARGE_TEXT_CHARS",
    "TokenizerLike",
    "TokenizerWorker",
    "decode_keeping",
    "decode_response",
    "encode_prompt",
    "render_chat",
    "tag_token_ids",
    "token_texts",
]

T = TypeVar("T")

LARGE_TEXT_CHARS = 65536
"""Prompts with more characters than this are tokenized on the server's second ("bulk") lane."""


class TokenizerLike(Protocol):
    """What the server needs of a tokenizer (a transformers `PreTrainedTokenizerBase` has it all)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> Any: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> Any: ...


def _as_ids(rendered: Any) -> list[int]:
    # transformers 5 returns a BatchEncoding by default; `return_dict=False` asks for the plain list.
    if isinstance(rendered, Mapping):
        rendered = rendered["input_ids"]
    return [int(t) for t in rendered]


def render_chat(
    tokenizer: TokenizerLike, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[int]:
    """Prompt ids of a conversation, ending with the assistant's generation prompt."""
    kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": True, "return_dict": False}
    if tools is not None:
        kwargs["tools"] = tools
    return _as_ids(tokenizer.apply_chat_template(messages, **kwargs))


def encode_prompt(tokenizer: TokenizerLike, prompt: str | Sequence[int]) -> list[int]:
    """Ids of a completion prompt: token ids as given, text encoded with the tokenizer's special tokens."""
    if isinstance(prompt, str):
        return _as_ids(tokenizer.encode(prompt))
    return list(prompt)


def tag_token_ids(tokenizer: TokenizerLike, tags: Sequence[str]) -> dict[int, str]:
    """Id -> text of each tag that the tokenizer holds as one token (an added or special token)."""
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    if convert is None:
        return {}
    unk = getattr(tokenizer, "unk_token_id", None)
    found: dict[int, str] = {}
    for tag in tags:
        token_id = convert(tag)
        if isinstance(token_id, int) and token_id >= 0 and token_id != unk:
            found[token_id] = tag
    return found


def decode_keeping(tokenizer: TokenizerLike, token_ids: Sequence[int], keep: Mapping[int, str]) -> str:
    """`token_ids` decoded with special tokens skipped, except the tokens of `keep`, written as their text."""
    parts: list[str] = []
    run: list[int] = []
    for token_id in token_ids:
        if token_id in keep:
            parts.append(str(tokenizer.decode(run, skip_special_tokens=True)) if run else "")
            parts.append(keep[token_id])
            run = []
        else:
            run.append(token_id)
    if run:
        parts.append(str(tokenizer.decode(run, skip_special_tokens=True)))
    return "".join(parts)


def decode_response(
    tokenizer: TokenizerLike, output: GenerationOutput, keep: Mapping[int, str] | None = None
) -> str:
    """The response's text: special tokens skipped (but those of `keep`), cut before the stop string that
    ended it."""
    ids = list(output.token_ids)
    if keep:
        text = decode_keeping(tokenizer, ids, keep)
    else:
        text = str(tokenizer.decode(ids, skip_special_tokens=True))
    if isinstance(output.stop_reason, str):
        cut = text.find(output.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


def token_texts(tokenizer: TokenizerLike, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded alone (special tokens kept, so every log-prob entry has its token's text)."""
    return [str(tokenizer.decode([t])) for t in token_ids]


class TokenizerWorker:
    """Tokenizer calls on one thread of their own, each bounded by `timeout_s` (see the module docstring)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quartet-tokenizer")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the tokenizer thread; a 400 naming no field when it outlasts `timeout_s`."""
        future = asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.timeout_s)
        except TimeoutError:
            raise ApiError(
                400,
                f"tokenizing this request took longer than {self.timeout_s:g} s; send a shorter prompt",
                "invalid_request_error",
                code="tokenizer_timeout",
            ) from None

    def close(self) -> None:
        """Stop the thread once its queued calls are done (without waiting for them)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
