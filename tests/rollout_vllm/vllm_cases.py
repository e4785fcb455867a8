"""Tiny saved models and shared checks of the vLLM engine tests (imported by both test modules).

vLLM's CPU attention needs a head size of at least 32, so these models have 2 heads of 32 (the shared tiny
model has 4 heads of 16). The weights are re-drawn larger (`varied_model`) so that outputs vary, and saved
with `save_pretrained`: the engine loads them by path, as it would a checkpoint.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from rollout_cases import PROMPTS, recompute_logprobs, varied_model
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from quartet.config import TinyModelConfig
from quartet.models.loading import load_tokenizer
from quartet.models.tiny import ensure_tiny_model
from quartet.rollout import GenerationOutput, SamplingParams

MAX_LEN = 128


@dataclass
class TinyCase:
    """A saved tiny model: its folder, the same weights in transformers, its tokenizer and prompts."""

    folder: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    prompts: list[list[int]]


def build_case(root: Path, name: str, *, tied: bool, with_tokenizer: bool = True) -> TinyCase:
    spec = TinyModelConfig(num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)
    base = ensure_tiny_model(spec, root / "base")
    model = varied_model(base)
    folder = root / name
    model.save_pretrained(folder)
    if with_tokenizer:
        for path in base.iterdir():
            if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
                shutil.copy(path, folder / path.name)
    tok = load_tokenizer(base)
    prompts = [list(tok(t)["input_ids"]) for t in PROMPTS]
    return TinyCase(folder, model, tok, prompts)


def greedy(max_new: int, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True, **kw)  # type: ignore[arg-type]


def assert_logprobs_match(
    model: PreTrainedModel, prompt: list[int], out: GenerationOutput, temperature: float
) -> None:
    """The engine's log-probs of `out` equal a transformers recomputation of log_softmax(logits / T)."""
    response = list(out.token_ids)
    assert out.logprobs is not None and len(out.logprobs) == len(response)
    ref = recompute_logprobs(model, prompt, response, temperature)
    torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)
