"""The server's two tokenizer threads: one for ordinary texts, one for large ones on its own tokenizer copy.

The event loop never tokenizes: chat rendering, encoding and decoding run on a `TokenizerWorker` thread,
each call bounded in time. Texts over `LARGE_TEXT_CHARS` characters take the bulk lane, so large prompts
queue behind each other, never in front of ordinary ones; the bulk lane has its own deep copy of the
tokenizer (made on first use), because a fast tokenizer must be entered by one thread. A template or
encoding failure is about the caller's input: a 400 naming the field.
"""

from __future__ import annotations

import copy

from quartet.serving import protocol
from quartet.serving.errors import ApiError
from quartet.serving.text import LARGE_TEXT_CHARS, TokenizerLike, TokenizerWorker, encode_prompt, render_chat

__all__ = ["TokenizerLanes"]


class TokenizerLanes:
    """Rendering and encoding on the lane a text's size picks; decoding on the ordinary lane."""

    def __init__(self, tokenizer: TokenizerLike, timeout_s: float) -> None:
        self.tokenizer = tokenizer
        self.ordinary = TokenizerWorker(timeout_s)
        """Texts up to `LARGE_TEXT_CHARS` characters, and every decoding of a response."""
        self.bulk = TokenizerWorker(timeout_s)
        """Prompts over `LARGE_TEXT_CHARS` characters, on their own copy of the tokenizer."""
        self._bulk_tokenizer: TokenizerLike | None = None

    def lane(self, chars: int) -> TokenizerWorker:
        """The bulk lane for large texts, so that they only ever wait for each other."""
        return self.bulk if chars > LARGE_TEXT_CHARS else self.ordinary

    def _tokenizer_of(self, lane: TokenizerWorker) -> TokenizerLike:
        """The tokenizer of a lane, called on its thread (a fast tokenizer must be entered by one thread)."""
        if lane is not self.bulk:
            return self.tokenizer
        if self._bulk_tokenizer is None:
            self._bulk_tokenizer = copy.deepcopy(self.tokenizer)
        return self._bulk_tokenizer

    async def render(self, chat: protocol.ChatRequest) -> list[int]:
        """The prompt ids of a chat (its template applied), on the lane of its size."""
        lane = self.lane(chat.text_chars)
        ids: list[int] = await lane.run(self._render, chat, lane)
        return ids

    async def encode(self, prompt: str) -> list[int]:
        """The ids of a text prompt, on the lane of its size."""
        lane = self.lane(len(prompt))
        ids: list[int] = await lane.run(self._encode, prompt, lane)
        return ids

    def close(self) -> None:
        self.ordinary.close()
        self.bulk.close()

    def _render(self, chat: protocol.ChatRequest, lane: TokenizerWorker) -> list[int]:
        try:
            return render_chat(self._tokenizer_of(lane), chat.messages, chat.tools)
        except Exception as exc:  # a template error is about the caller's messages
            raise ApiError.bad_request(
                f"the chat template cannot render these messages: {type(exc).__name__}: {exc}", "messages"
            ) from None

    def _encode(self, prompt: str, lane: TokenizerWorker) -> list[int]:
        try:
            return encode_prompt(self._tokenizer_of(lane), prompt)
        except Exception as exc:
            raise ApiError.bad_request(
                f"the prompt cannot be tokenized: {type(exc).__name__}: {exc}", "prompt"
            ) from None
