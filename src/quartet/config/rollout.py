"""Generation: engine choice, sampling, and memory of the inference engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from quartet.config.errors import require
from quartet.config.model import Dtype

__all__ = ["RolloutConfig", "RolloutEngineKind", "RolloutMode", "SamplingConfig"]


class RolloutEngineKind(StrEnum):
    """Inference engine behind the token-in/token-out interface."""

    TORCH = "torch"  # built-in PyTorch engine, no extra dependency
    VLLM = "vllm"  # needs the `vllm` extra


class RolloutMode(StrEnum):
    """How the driver reaches the engine."""

    SYNC = "sync"  # batch calls from the driver (single-turn)
    ASYNC = "async"  # one OpenAI-compatible server per replica, agent loops drive it


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling parameters of one generation call."""

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy."""

    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]."""

    top_k: int = 0
    """Keep the k most likely tokens; 0 disables."""

    n: int = 1
    """Samples per prompt."""

    def __post_init__(self) -> None:
        require(
            self.temperature >= 0, "temperature", f"must be >= 0, got {self.temperature}", "use 0 for greedy"
        )
        require(
            0.0 < self.top_p <= 1.0, "top_p", f"must lie in (0, 1], got {self.top_p}", "use 1.0 to disable"
        )
        require(self.top_k >= 0, "top_k", f"must be >= 0, got {self.top_k}", "use 0 to disable")
        require(self.n >= 1, "n", f"must be >= 1, got {self.n}")


@dataclass(frozen=True)
class RolloutConfig:
    """Generation during training and validation."""

    engine: RolloutEngineKind = RolloutEngineKind.TORCH
    """Inference engine."""

    mode: RolloutMode = RolloutMode.SYNC
    """Batch calls from the driver, or async servers for agent loops."""

    n: int = 4
    """Responses sampled per training prompt (the group size of GRPO/RLOO)."""

    temperature: float = 1.0
    """Sampling temperature of training rollouts (log-probs are computed at the same temperature)."""

    top_p: float = 1.0
    """Nucleus sampling mass of training rollouts."""

    top_k: int = 0
    """Top-k of training rollouts; 0 disables."""

    val: SamplingConfig = field(default_factory=lambda: SamplingConfig(temperature=0.0, n=1))
    """Sampling of validation rollouts (greedy, one sample, by default)."""

    max_num_seqs: int = 64
    """Sequences decoded together by one engine (continuous batching width), per replica."""

    kv_cache_tokens: int = 0
    """KV-cache capacity in tokens per replica; 0 sizes it to max_num_seqs x (prompt + response length)."""

    tensor_parallel_size: int = 1
    """Devices per engine replica."""

    sleep_while_training: bool = True
    """Free the engine's KV cache (and weights, where the engine can) while the trainer runs."""

    seed: int = 0
    """Base seed of sampling; each step and rank derive their own from it."""

    dtype: Dtype = Dtype.FLOAT32
    """Weights dtype of the inference engine (float32 is fastest on CPUs without AMX; bfloat16 on GPU)."""

    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take for weights and KV cache (vLLM on GPU only)."""

    logprob_diff_warn: float = 0.05
    """Warn when the mean |rollout - trainer| log-prob difference of a step exceeds this (stale weights?)."""

    def __post_init__(self) -> None:
        SamplingConfig(self.temperature, self.top_p, self.top_k, self.n)  # same local checks
        require(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization",
            f"must lie in (0, 1], got {self.gpu_memory_utilization}",
            "use e.g. 0.5 when the actor trains on the same GPU",
        )
        require(self.logprob_diff_warn > 0, "logprob_diff_warn", "must be > 0")
        require(self.max_num_seqs > 0, "max_num_seqs", "must be > 0")
        require(self.kv_cache_tokens >= 0, "kv_cache_tokens", "must be >= 0", "use 0 for automatic sizing")
        require(self.tensor_parallel_size >= 1, "tensor_parallel_size", "must be >= 1")

    @property
    def sampling(self) -> SamplingConfig:
        """The training sampling parameters as one object."""
        return SamplingConfig(self.temperature, self.top_p, self.top_k, self.n)
