"""Model folders for the engine tests (built once per session from the tiny causal LM)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def value_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny causal LM's trunk with a fresh value head (token classification, one label)."""
    from quartet.models.tiny import save_value_model

    torch.manual_seed(1)
    return save_value_model(tiny_model_dir, tmp_path_factory.mktemp("value"))


@pytest.fixture(scope="session")
def reward_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny causal LM's trunk with a fresh scalar sequence-classification head."""
    from quartet.engines.model_init import load_reward_model

    torch.manual_seed(2)
    model = load_reward_model(tiny_model_dir)
    folder = tmp_path_factory.mktemp("reward")
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen3-MoE (8 experts, top-2) with expert weights x4 and router weights x10, so that the
    experts weigh in the log-probs and the routing is decisive (the expert- and sequence-parallel MoE
    exactness tests)."""
    from transformers import AutoModelForCausalLM

    from quartet.config import TinyModelConfig
    from quartet.config.model import TinyArch
    from quartet.models.tiny import ensure_tiny_model

    tiny = ensure_tiny_model(TinyModelConfig(arch=TinyArch.QWEN3_MOE), tmp_path_factory.mktemp("moe_src"))
    model = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(4.0)
            layer.mlp.experts.down_proj.mul_(4.0)
            layer.mlp.gate.weight.mul_(10.0)
    folder = tmp_path_factory.mktemp("moe")
    model.save_pretrained(folder)
    for file in tiny.iterdir():
        if file.is_file() and not (folder / file.name).exists():  # the tokenizer's files
            (folder / file.name).write_bytes(file.read_bytes())
    return folder
