"""The vLLM engine's tests: shared rollout cases on the path, and the tiny saved models they run on."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import quartet  # noqa: F401 - first: its torchvision guard must precede transformers (quartet.models.torchvision_ops)

_ROLLOUT_TESTS = str(Path(__file__).resolve().parents[1] / "rollout")
if _ROLLOUT_TESTS not in sys.path:  # absent when only this folder is collected (`make test-vllm`)
    sys.path.insert(0, _ROLLOUT_TESTS)

from vllm_cases import TinyCase, build_case  # noqa: E402 - needs the path above


@pytest.fixture(scope="session")
def tied(tmp_path_factory: pytest.TempPathFactory) -> TinyCase:
    """Tied input/output embeddings, tokenizer saved next to the weights."""
    return build_case(tmp_path_factory.mktemp("vllm-models"), "tied", tied=True)


@pytest.fixture(scope="session")
def untied(tmp_path_factory: pytest.TempPathFactory) -> TinyCase:
    """Untied output layer, and no tokenizer in the folder (vLLM runs without one)."""
    return build_case(tmp_path_factory.mktemp("vllm-models"), "untied", tied=False, with_tokenizer=False)
