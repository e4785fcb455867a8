"""The tokenizer side of the server: chat rendering, prompt encoding, and decoding of responses.

The server only ever hands the engine token ids, so every text <-> ids step lives here:

- chat messages are rendered with the tokenizer's own chat template (`apply_chat_template` with
  `add_generation_prompt=True`), `tools` passed through to it, exactly as a trainer renders prompts;
- response text is decoded with special tokens skipped (the end-of-turn token and tool-call tags that are
  special tokens disappear, as in vLLM's text output); a response ended by a stop *string* is cut before
  that string, as OpenAI documents, while its token ids and usage still count every generated token;
- the text of one token (for log-prob entries) is that token decoded alone.

These calls run on the server's event loop rather than in worker threads: a Hugging Face fast tokenizer must
not be entered from several threads at once (it can fail with "Already borrowed"), and rendering a prompt
costs far less than one engine step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from quartet.rollout.types import GenerationOutput

__all__ = ["TokenizerLike", "decode_response", "encode_prompt", "render_chat", "token_texts"]


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


def decode_response(tokenizer: TokenizerLike, output: GenerationOutput) -> str:
    """The response's text: special tokens skipped, cut before the stop string that ended it."""
    text = str(tokenizer.decode(list(output.token_ids), skip_special_tokens=True))
    if isinstance(output.stop_reason, str):
        cut = text.find(output.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


def token_texts(tokenizer: TokenizerLike, token_ids: Sequence[int]) -> list[str]:
    """Each token decoded alone (special tokens kept, so every log-prob entry has its token's text)."""
    return [str(tokenizer.decode([t])) for t in token_ids]
