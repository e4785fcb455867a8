"""Shared helpers of the rollout tests: a tiny model with varied outputs, and independent references."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence, Set
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from quartet.models.loading import load_causal_lm, load_tokenizer
from quartet.rollout import SamplingParams

PROMPTS = [
    "What is 12 + 7?",
    "hello",
    "the answer is what compute add subtract multiply sum of and result",
    "thanks: 5 - 2",
    "<|im_start|>user\nplease solve 3 * 4<|im_end|>\n<|im_start|>assistant\n",
]


def varied_model(folder: Path, seed: int = 0) -> PreTrainedModel:
    """The tiny model with larger random weights: greedy outputs vary instead of repeating one token.

    (The saved tiny model is initialised with std 0.02, so its logits are nearly flat.)
    """
    model = load_causal_lm(folder)
    model.train(False)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.5 / param.shape[1] ** 0.5, generator=gen)
    return model


@functools.cache
def shared_model(folder: Path) -> PreTrainedModel:
    """One varied model per process, for tests that never change its weights."""
    return varied_model(folder)


@functools.cache
def tokenizer(folder: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(folder)


def prompt_ids(folder: Path, texts: list[str] | None = None) -> list[list[int]]:
    tok = tokenizer(folder)
    return [list(tok(t)["input_ids"]) for t in (texts or PROMPTS)]


def recompute_logprobs(
    model: PreTrainedModel, prompt: list[int], response: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of each response token [R]: one unpadded full forward of prompt + response."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    scores = logits[len(prompt) - 1 : -1] / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scores, dim=-1).gather(1, torch.tensor(response).unsqueeze(1)).squeeze(1)


def recompute_logits(model: PreTrainedModel, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Next-token logits before each response token [R, V] (unpadded full forward)."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        return model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()


def hf_greedy(model: PreTrainedModel, prompts: list[list[int]], max_new: int, pad_id: int) -> list[list[int]]:
    """transformers' greedy `generate` on the left-padded batch of prompts, never stopping early."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None  # like ignore_eos: every row generates max_new tokens
    config.pad_token_id = pad_id
    config.do_sample = False
    config.max_new_tokens = max_new
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    return [row.tolist() for row in out[:, width:]]


def slow_penalised(
    logits: list[float],
    prompt: Sequence[int],
    generated: Sequence[int],
    params: SamplingParams,
    stop_ids: Set[int],
) -> list[float]:
    """Next-token logits after penalties and `min_tokens`, token by token, from the definitions:
    repetition (vLLM/transformers) over prompt and response, then frequency and presence (OpenAI) over the
    response, then the stop ids masked while fewer than `min_tokens` tokens are generated."""
    out = []
    for v, x in enumerate(logits):
        count = sum(1 for t in generated if t == v)
        if v in prompt or count > 0:
            x = x / params.repetition_penalty if x > 0 else x * params.repetition_penalty
        x -= params.frequency_penalty * count
        if count > 0:
            x -= params.presence_penalty
        if len(generated) < params.min_tokens and v in stop_ids:
            x = -math.inf
        out.append(x)
    return out


def slow_log_softmax(values: list[float]) -> list[float]:
    """log_softmax by its definition (entries of -inf stay -inf)."""
    top = max(values)
    norm = top + math.log(sum(math.exp(x - top) for x in values))
    return [x - norm for x in values]
