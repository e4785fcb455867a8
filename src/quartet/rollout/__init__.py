"""Rollout: inference engines behind one token-in/token-out interface.

`RolloutEngine` is the interface; `TorchRolloutEngine` is the built-in PyTorch engine (continuous batching,
prefix sharing for the n samples of a prompt, on-device sampling); `VLLMRolloutEngine` puts vLLM behind
the same interface (the `vllm` extra; vLLM itself is imported only when an engine is built); `make_engine`
picks one from the config; `generate_batch` turns a `Batch` of prompts into a `Batch` of responses.
"""

from __future__ import annotations

from quartet.rollout.base import EngineStateError, RolloutEngine
from quartet.rollout.batch_io import generate_batch, outputs_to_batch, requests_from_batch
from quartet.rollout.factory import make_engine
from quartet.rollout.invalid_request import InvalidRequestError
from quartet.rollout.torch.engine import TorchRolloutEngine
from quartet.rollout.torch.model_runner import UnsupportedModelError
from quartet.rollout.types import FinishReason, GenerationOutput, GenerationRequest, SamplingParams
from quartet.rollout.vllm_engine import VLLMRolloutEngine

__all__ = [
    "EngineStateError",
    "FinishReason",
    "GenerationOutput",
    "GenerationRequest",
    "InvalidRequestError",
    "RolloutEngine",
    "SamplingParams",
    "TorchRolloutEngine",
    "UnsupportedModelError",
    "VLLMRolloutEngine",
    "generate_batch",
    "make_engine",
    "outputs_to_batch",
    "requests_from_batch",
]
