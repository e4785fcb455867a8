"""`make_engine` and the lazy vLLM import: these run in the main suite, where vLLM is not installed."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rollout_cases import prompt_ids

from quartet.config.rollout import RolloutConfig, RolloutEngineKind
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.factory import make_engine
from quartet.rollout.vllm_engine import import_vllm

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.vllm  # meaningful where vLLM is installed; passes anywhere
def test_importing_the_rollout_package_does_not_import_vllm() -> None:
    code = (
        "import sys, quartet.rollout, quartet.rollout.factory, quartet.rollout.vllm_engine; "
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_missing_vllm_is_an_import_error_that_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'quartet\[vllm\]'.*make test-vllm"):
        import_vllm()


@pytest.mark.skipif(HAS_VLLM, reason="checks the error raised when vLLM is not installed")
def test_factory_vllm_kind_without_vllm_says_how_to_install(tiny_model_dir: Path) -> None:
    with pytest.raises(ImportError, match="quartet\\[vllm\\]"):
        make_engine(
            RolloutEngineKind.VLLM,
            str(tiny_model_dir),
            RolloutConfig(),
            max_model_len=64,
            dtype="float32",
            seed=0,
        )


def test_factory_builds_the_torch_engine_from_the_config(tiny_model_dir: Path) -> None:
    cfg = RolloutConfig(max_num_seqs=3, kv_cache_tokens=3 * 40)
    engine = make_engine(
        RolloutEngineKind.TORCH, str(tiny_model_dir), cfg, max_model_len=64, dtype=torch.float32, seed=4
    )
    try:
        assert isinstance(engine, TorchRolloutEngine)
        assert engine.core.max_num_seqs == 3 and engine.core.max_model_len == 40  # the token budget caps it
        assert next(engine.model.parameters()).dtype == torch.float32
        out = engine.generate(
            [GenerationRequest(tuple(prompt_ids(tiny_model_dir)[0]), SamplingParams(max_new_tokens=4))]
        )
    finally:
        engine.shutdown()
    assert 1 <= len(out[0][0].token_ids) <= 4


def test_factory_rejects_tensor_parallel_vllm(tiny_model_dir: Path) -> None:
    cfg = RolloutConfig(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="tensor_parallel_size"):  # before vLLM is even imported
        make_engine(
            RolloutEngineKind.VLLM, str(tiny_model_dir), cfg, max_model_len=64, dtype="bfloat16", seed=0
        )
