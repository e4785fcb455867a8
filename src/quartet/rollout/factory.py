"""Build the configured rollout engine over a local model folder."""

from __future__ import annotations

import torch

from quartet.config.rollout import RolloutConfig, RolloutEngineKind
from quartet.rollout.base import RolloutEngine

__all__ = ["make_engine"]


def make_engine(
    kind: RolloutEngineKind,
    folder: str,
    rollout_cfg: RolloutConfig,
    *,
    max_model_len: int,
    dtype: torch.dtype | str,
    seed: int,
) -> RolloutEngine:
    """The engine `kind` over the causal LM in `folder`, sized by the rollout config."""
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if kind is RolloutEngineKind.TORCH:
        from quartet.rollout.torch_engine import TorchRolloutEngine

        return TorchRolloutEngine.from_pretrained(
            folder,
            dtype=torch_dtype,
            device="cuda" if torch.cuda.is_available() else "cpu",
            max_num_seqs=rollout_cfg.max_num_seqs,
            max_model_len=max_model_len,
            seed=seed,
        )
    from quartet.rollout.vllm_engine import VLLMRolloutEngine  # the `vllm` extra

    return VLLMRolloutEngine.from_pretrained(  # type: ignore[no-any-return]
        folder,
        dtype=str(torch_dtype).removeprefix("torch."),
        max_model_len=max_model_len,
        max_num_seqs=rollout_cfg.max_num_seqs,
        seed=seed,
        gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
    )
