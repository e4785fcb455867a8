"""Shared helpers of the serving tests: names, the client, and direct engine references."""

from __future__ import annotations

from typing import Any

import openai
from transformers import PreTrainedTokenizerBase

from quartet.rollout import GenerationOutput, GenerationRequest, SamplingParams, TorchRolloutEngine

MODEL_NAME = "tiny-policy"
API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES: list[dict[str, Any]] = [{"role": "user", "content": "What is 12 + 7?"}]


def client(url: str, api_key: str = API_KEY) -> openai.OpenAI:
    """The official client, without retries (a 503 must surface at once)."""
    return openai.OpenAI(base_url=url, api_key=api_key, max_retries=0, timeout=60)


def direct(engine: TorchRolloutEngine, prompt: list[int], **sampling: Any) -> list[GenerationOutput]:
    """The reference: the same prompt ids generated directly through the engine."""
    return engine.generate([GenerationRequest(tuple(prompt), SamplingParams(**sampling))])[0]


def chat_prompt(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    """Prompt ids rendered independently of the server, with the tokenizer's chat template."""
    ids = tok.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kw
    )
    return [int(t) for t in ids]
