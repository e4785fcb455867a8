"""Fixtures of the serving tests: one built-in engine over the tiny model, served once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from serving_cases import API_KEY, MODEL_NAME
from transformers import PreTrainedTokenizerBase

from quartet.models.loading import load_causal_lm, load_tokenizer
from quartet.rollout import TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread


@pytest.fixture(scope="session")
def serving_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="session")
def serving_engine(
    tiny_model_dir: Path, serving_tokenizer: PreTrainedTokenizerBase
) -> Iterator[TorchRolloutEngine]:
    """The built-in engine over the tiny model with larger random weights, so greedy outputs vary.

    (The saved tiny model is initialised with std 0.02: its logits are nearly flat and greedy decoding
    repeats one token, which would make text comparisons weak.)
    """
    model = load_causal_lm(tiny_model_dir)
    model.train(False)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.5 / param.shape[1] ** 0.5, generator=gen)
    engine = TorchRolloutEngine(model, serving_tokenizer, max_num_seqs=8, num_threads=1)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def served(
    serving_engine: TorchRolloutEngine, serving_tokenizer: PreTrainedTokenizerBase
) -> Iterator[tuple[OpenAIServer, ServerThread, str]]:
    """The engine behind an OpenAI-compatible server in a background thread: (server, thread, base url)."""
    server = OpenAIServer(
        serving_engine,
        serving_tokenizer,
        MODEL_NAME,
        api_key=API_KEY,
        max_new_tokens_default=16,
        request_timeout_s=60,
    )
    thread = ServerThread(server)
    url = thread.start()
    yield server, thread, url
    thread.stop()
