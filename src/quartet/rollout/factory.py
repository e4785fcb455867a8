"""The rollout engine a config asks for, over a model saved in a local folder.

One place maps `RolloutEngineKind` to a class, with an exhaustive match rather than a registry: a new kind
fails type checking here instead of at run time inside a remote actor. The vLLM engine is imported only when
it is chosen, so the built-in engine never needs the `vllm` extra.
"""

from __future__ import annotations

from pathlib import Path

import torch

from quartet.config.rollout import RolloutConfig, RolloutEngineKind, RolloutQuantization
from quartet.rollout.base import RolloutEngine

__all__ = ["make_engine"]

FP8 = RolloutQuantization.FP8


def make_engine(
    kind: RolloutEngineKind,
    folder: str | Path,
    rollout_cfg: RolloutConfig,
    *,
    max_model_len: int,
    dtype: torch.dtype | str,
    seed: int,
) -> RolloutEngine:
    """A `kind` engine over the causal LM in `folder`, sized by `rollout_cfg`.

    max_model_len: prompt + response limit. The KV cache holds `rollout_cfg.kv_cache_tokens` tokens, or
    `max_num_seqs` full-length sequences when that is 0 (vLLM on GPU: explicit bytes, so
    `gpu_memory_utilization` only bounds the rest). The built-in engine runs on the GPU when there is one.
    seed: of requests that bring none (callers derive one per replica from `rollout_cfg.seed`).
    """
    dtype_name = str(dtype).removeprefix("torch.")
    kv_tokens = rollout_cfg.kv_cache_tokens or rollout_cfg.max_num_seqs * max_model_len
    match kind:
        case RolloutEngineKind.TORCH:
            from quartet.rollout.torch.engine import TorchRolloutEngine

            # The built-in cache grows on demand; a token budget caps each sequence (as in `from_config`).
            per_seq = kv_tokens // rollout_cfg.max_num_seqs
            return TorchRolloutEngine.from_pretrained(
                folder,
                dtype=getattr(torch, dtype_name),
                device="cuda" if torch.cuda.is_available() else "cpu",
                max_num_seqs=rollout_cfg.max_num_seqs,
                max_model_len=min(max_model_len, per_seq),
                seed=seed,
                cuda_graphs=rollout_cfg.cuda_graphs,
                record_routing=rollout_cfg.record_routing,
                quantization=rollout_cfg.quantization,
                fused_kernels=rollout_cfg.fused_kernels,
            )
        case RolloutEngineKind.VLLM:
            from quartet.rollout.vllm_engine import VLLMRolloutEngine

            if rollout_cfg.tensor_parallel_size != 1:
                raise ValueError(
                    f"tensor_parallel_size={rollout_cfg.tensor_parallel_size}: the in-process vLLM engine "
                    "runs one worker; use 1"
                )
            if rollout_cfg.quantization is FP8:  # the config refuses it; a hand-built config must not slip by
                raise ValueError("rollout.quantization=fp8 is built for rollout.engine=torch only")
            return VLLMRolloutEngine.from_pretrained(
                folder,
                dtype=dtype_name,
                max_model_len=max_model_len,
                max_num_seqs=rollout_cfg.max_num_seqs,
                seed=seed,
                kv_cache_tokens=kv_tokens,
                gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
            )
