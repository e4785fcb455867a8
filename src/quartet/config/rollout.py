"""Generation: engine choice, sampling, and memory of the inference engine."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from quartet.config.errors import require
from quartet.config.model import Dtype

__all__ = [
    "BUILTIN_INTERACTIONS",
    "BUILTIN_TOOLS",
    "FP8_PROJECTIONS",
    "FusedKernels",
    "MultiTurnConfig",
    "RolloutConfig",
    "RolloutEngineKind",
    "RolloutInterface",
    "RolloutQuantization",
    "SamplingConfig",
    "ServerConfig",
    "TemplateMode",
    "WeightApply",
    "WeightTransport",
    "WeightSyncConfig",
]

BUILTIN_TOOLS = ("calculator", "python", "zoom")
BUILTIN_INTERACTIONS = ("guessing_game",)
FP8_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The decoder layers' `nn.Linear` modules `rollout.quantization=fp8` stores in fp8 (by name; the engine
quantizes them, the planner counts them)."""


class RolloutEngineKind(StrEnum):
    """Inference engine behind the token-in/token-out interface."""

    TORCH = "torch"  # built-in PyTorch engine, no extra dependency
    VLLM = "vllm"  # needs the `vllm` extra


class RolloutQuantization(StrEnum):
    """How the rollout engine stores the policy's linear weights (the trainer keeps its own precision)."""

    NONE = "none"  # in rollout.dtype, as the trainer sends them
    FP8 = "fp8"  # float8 e4m3 with one scale per output channel, re-quantized at every weight sync


class FusedKernels(StrEnum):
    """`rollout.fused_kernels`: the built-in engine's fused Triton decode kernels."""

    AUTO = "auto"
    """On CUDA where Triton imports and each kernel compiles (else that kernel's torch path, logged)."""
    OFF = "off"
    """The torch path."""
    ON = "on"
    """The kernels, or an error naming why one cannot run."""


class RolloutInterface(StrEnum):
    """How the engine is reached: what it offers, not when generation runs (that is `trainer.mode`)."""

    BATCH = "batch"  # batch calls on the rollout group from the driver only
    SERVER = "server"  # also an OpenAI-compatible HTTP server per replica, for agent frameworks


class TemplateMode(StrEnum):
    """What a multi-turn run does with a chat template that re-renders history differently from the tokens
    the engine produced (`quartet check template`; docs/multi_turn.md, "Chat templates across turns")."""

    KEEP_HISTORY_TOKENS = "keep_history_tokens"  # engine tokens kept, new messages rendered as a delta
    STRICT = "strict"  # as keep_history_tokens, but refuse to start unless the template keeps the prefix
    RERENDER = "rerender"  # the prompt is the template's rendering of the messages every turn


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
class MultiTurnConfig:
    """Agent loops: one dataset row -> one multi-turn trajectory (tools, a simulated user)."""

    enable: bool = False
    """Run every rollout through an agent loop (chosen per row by its `agent_name` column)."""

    default_agent: str = "tool_agent"
    """Loop of rows without an `agent_name`: a built-in one (single_turn, tool_agent, user_sim) or one
    registered with `@register_agent_loop` in `algorithm.custom_module` (checked when the run starts, by
    `quartet.agents.loops`, where the loops are)."""

    tools: tuple[str, ...] = ()
    """Built-in tools to offer the model, by name: calculator, python, zoom (a crop of the prompt's image,
    enlarged: vision-language models)."""

    tool_config_path: str = ""
    """YAML file declaring more tools (`class`, `config`, `schema` per entry; see quartet.agents.tools)."""

    interactions: tuple[str, ...] = ()
    """Built-in simulated users, by name: guessing_game."""

    interaction_config_path: str = ""
    """YAML file declaring more interactions (`class`, `name`, `config` per entry)."""

    tool_call_format: str = "hermes"
    """How tool calls are written: hermes (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`)."""

    max_assistant_turns: int = 4
    """Model turns per trajectory at most."""

    max_user_turns: int = 4
    """Simulated-user replies per trajectory at most (user_sim)."""

    max_tool_response_length: int = 256
    """Characters of a tool result shown to the model; longer ones are cut with a marker."""

    tool_timeout_s: float = 10.0
    """Longest wait for one tool call; a slower call is answered to the model as a timeout error."""

    check_drift: bool = True
    """Re-render each conversation with the chat template and report `agent/token_drift` (0 = exact)."""

    template_mode: TemplateMode = TemplateMode.KEEP_HISTORY_TOKENS
    """Multi-turn prompts against the chat template, checked on the first rows before any generation:
    keep_history_tokens (the engine's tokens are kept, only new messages are rendered: the trained tokens
    are the generated ones whatever the template does to history), strict (the same, but refuse to start
    when re-rendering a conversation would not extend its earlier tokens, e.g. a template that drops
    `<think>` from earlier turns), rerender (the engine sees the template's rendering of the messages every
    turn; earlier model turns the template changed are masked out of the loss, counted in
    `agent/template_rerender_breaks`)."""

    step_deadline_s: float = 0.0
    """Longest a step's agent loops may run (seconds from the start of its rollout); then every unfinished
    trajectory is cut where it stands: its generation in flight is aborted and dropped, its finished turns
    stay, it ends with finish_reason `deadline`, is scored like any other, and is counted
    (`agent/deadline_cut/total`). One slow conversation cannot hold the step. 0: no deadline."""

    success_score: float = 1.0
    """A trajectory whose outcome score reaches this counts as a success in `agent/success` and
    `agent/turns_to_success`."""

    environment: str = ""
    """The environment (`@register_environment`, docs/environments.md) of rows run by the `environment`
    agent loop whose `extra_info.env_kwargs` name none. Checked when the run starts."""

    environment_kwargs: Any = field(default_factory=dict)
    """A mapping: arguments every environment instance is built with; a row's `extra_info.env_kwargs`
    override them key by key."""

    env_timeout_s: float = 30.0
    """Longest wait for one environment call (reset, step, close); a slower one fails its row (counted,
    named, not trained) and the run goes on."""

    def __post_init__(self) -> None:
        require(bool(self.default_agent), "default_agent", "must name an agent loop", "e.g. tool_agent")
        for name in self.tools:
            require(
                name in BUILTIN_TOOLS,
                "tools",
                f"unknown built-in tool {name!r}",
                f"use any of {', '.join(BUILTIN_TOOLS)}, or declare it in tool_config_path",
            )
        for name in self.interactions:
            require(
                name in BUILTIN_INTERACTIONS,
                "interactions",
                f"unknown built-in interaction {name!r}",
                f"use any of {', '.join(BUILTIN_INTERACTIONS)}, or declare it in interaction_config_path",
            )
        require(self.tool_call_format == "hermes", "tool_call_format", "only 'hermes' is built in")
        require(self.max_assistant_turns >= 1, "max_assistant_turns", "must be >= 1")
        require(self.max_user_turns >= 0, "max_user_turns", "must be >= 0")
        require(self.max_tool_response_length >= 1, "max_tool_response_length", "must be >= 1")
        require(self.tool_timeout_s > 0, "tool_timeout_s", "must be > 0")
        require(self.step_deadline_s >= 0, "step_deadline_s", "must be >= 0 (0: no deadline)")
        require(self.env_timeout_s > 0, "env_timeout_s", "must be > 0")
        require(
            isinstance(self.environment_kwargs, Mapping)
            and all(isinstance(k, str) for k in self.environment_kwargs),
            "environment_kwargs",
            f"must be a mapping of argument names to values, got {self.environment_kwargs!r}",
            "e.g. environment_kwargs: {max_guesses: 5}",
        )
        require(
            "name" not in self.environment_kwargs,
            "environment_kwargs",
            "must not hold 'name'",
            "name the environment with rollout.multi_turn.environment",
        )


@dataclass(frozen=True)
class ServerConfig:
    """The OpenAI-compatible server of each rollout replica (`rollout.interface=server`)."""

    host: str = "127.0.0.1"
    """Interface to listen on; 0.0.0.0 serves other machines too (set an api_key then), and the URL then
    names this node's address (Ray's node IP), not the wildcard."""

    port: int = 0
    """Port of rank 0's server (rank r listens on port + r); 0 picks free ports."""

    api_key: str = ""
    """When set, requests must send `Authorization: Bearer <api_key>`."""

    request_timeout_s: float = 600.0
    """Longest wait per request; a slower one is aborted in the engine and answered 504."""

    model_name: str = "policy"
    """The model name the server answers to (`/v1/models`)."""

    max_n: int = 64
    """Most responses one request may ask for (`n`; the engine's default batch width); a larger `n` is
    answered 400 before the engine."""

    max_request_tokens: int = 262144
    """Most tokens one request may cost the engine: prompt tokens + n x max_tokens; above: 400."""

    max_body_bytes: int = 8 * 2**20
    """Largest request body in bytes (413 above it); text prompts are also refused before tokenizing
    when longer than 8 characters per allowed token (`max_request_tokens`)."""

    def __post_init__(self) -> None:
        require(0 <= self.port < 65536, "port", f"must lie in [0, 65535], got {self.port}")
        require(self.request_timeout_s > 0, "request_timeout_s", "must be > 0")
        require(bool(self.model_name), "model_name", "must not be empty")
        require(1 <= self.max_n <= 4096, "max_n", f"must lie in [1, 4096], got {self.max_n}")
        require(
            2 <= self.max_request_tokens <= 2**24,
            "max_request_tokens",
            f"must lie in [2, {2**24}], got {self.max_request_tokens}",
        )
        require(
            1024 <= self.max_body_bytes <= 2**30,
            "max_body_bytes",
            f"must lie in [1024, {2**30}] bytes, got {self.max_body_bytes}",
        )


class WeightApply(StrEnum):
    """When a rollout replica on a pool of its own applies weights that arrived."""

    BETWEEN_STEPS = "between_steps"
    """Between two decode steps: sequences in flight go on with the new weights (partial rollouts); each
    token is tagged with the version that computed it, and no forward pass ever mixes two versions."""
    AFTER_DRAIN = "after_drain"
    """When the replica has no generation in flight (after its current batch): every response is computed
    by one version."""


class WeightTransport(StrEnum):
    """How the actor's weight buckets reach rollout replicas on a pool of their own."""

    AUTO = "auto"
    """`cuda_ipc` when every replica is on the actor's node and the weights are on CUDA, else `gloo`."""
    GLOO = "gloo"
    """Each bucket's bytes broadcast over a gloo group (through host memory); works across nodes."""
    CUDA_IPC = "cuda_ipc"
    """Same node only: replicas map the actor's packed bucket on the GPU through a CUDA IPC handle and copy
    from it device to device (no host copy); each replica must see the actor's GPU."""
    SHM = "shm"
    """Same node only: buckets in host shared memory, mapped by the replicas (the CPU twin of cuda_ipc)."""


@dataclass(frozen=True)
class WeightSyncConfig:
    """How the actor's weights reach rollout replicas on a pool of their own (`cluster.separate_pools`)."""

    bucket_mb: int = 256
    """Size bound of one broadcast, in MiB: the actor gathers and packs at most two buckets at a time, so
    the whole model is never materialised on one rank at once."""

    timeout_s: float = 300.0
    """Longest one sync (and joining the group at start) may take; past it the run fails naming the
    replica, the version and the bytes moved so far."""

    apply: WeightApply = WeightApply.BETWEEN_STEPS
    """When a replica applies the weights that arrived (it receives them while it keeps generating)."""

    transport: WeightTransport = WeightTransport.AUTO
    """How buckets travel: auto, gloo, cuda_ipc or shm (the last two need every replica on the actor's
    node; docs/async.md)."""

    def __post_init__(self) -> None:
        require(1 <= self.bucket_mb <= 65536, "bucket_mb", f"must lie in [1, 65536], got {self.bucket_mb}")
        require(self.timeout_s > 0, "timeout_s", "must be > 0")
        require(
            self.transport in tuple(WeightTransport),
            "transport",
            f"unknown transport {self.transport!r}",
            f"choose one of {[t.value for t in WeightTransport]}",
        )
        object.__setattr__(self, "transport", WeightTransport(self.transport))

    @property
    def bucket_bytes(self) -> int:
        """`bucket_mb` in bytes."""
        return self.bucket_mb * 2**20


@dataclass(frozen=True)
class RolloutConfig:
    """Generation during training and validation."""

    engine: RolloutEngineKind = RolloutEngineKind.TORCH
    """Inference engine."""

    interface: RolloutInterface = RolloutInterface.BATCH
    """batch: the driver's batch calls on the rollout group only; server: each replica also serves an
    OpenAI-compatible HTTP API (agent frameworks, other processes). Not `trainer.mode`, which says when
    generation and training take turns."""

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

    quantization: RolloutQuantization = RolloutQuantization.NONE
    """Weights of the engine's decoder projections (q/k/v/o, gate/up/down): `none` keeps `dtype`; `fp8`
    stores them as float8 e4m3 with a float32 scale per output channel, at load and at every weight sync
    (half the bytes decode reads against bfloat16). Built-in engine: scaled fp8 matmuls on GPUs of compute
    capability 9.0+, emulated (dequantize, then matmul in `dtype`) elsewhere; vLLM: its own
    `quantization="fp8"`. Sampling then differs from the trainer's policy by the rounding:
    `rollout/logprob_diff_*` reports it and `actor.tis_cap` corrects for it (docs/fp8_rollout.md)."""

    cuda_graphs: bool = True
    """Built-in engine on a GPU: replay decode steps from CUDA graphs captured per bucketed batch size and
    length (false: eager, as vLLM's `enforce_eager`). No effect on CPU or with vLLM."""

    graph_decode_steps: int = 1
    """Built-in engine with `cuda_graphs` on a GPU: tokens each sequence decodes per graph replay (vLLM's
    multi-step scheduling). Above 1 the engine returns to the host for stop checks and admission only every
    that many tokens, for batches without penalties, grammars or top log-probs; a sequence that stops inside
    a block drops the rest of it (at most this minus 1 tokens of wasted work a sequence). 1: a token a
    replay. No effect on CPU or with vLLM."""

    fused_kernels: FusedKernels = FusedKernels.AUTO
    """Built-in engine: the decode step's fused Triton kernels (residual add + RMSNorm, RoPE with the
    KV-cache write, the sampler; docs/throughput.md). auto: on CUDA where Triton imports and each kernel
    compiles, else the torch path (logged once); off: the torch path; on: the kernels, or an error naming
    why not. No effect on CPU (auto) or with vLLM."""

    record_routing: bool = False
    """Mixture-of-experts models, built-in engine: record the top-k experts of every MoE layer for every
    token the engine processes (prompt and response) and carry them with the batch (`routed_experts`, one
    byte per layer and expert slot for <= 256 experts); the old-log-prob pass then reports
    `moe/routing_mismatch`. Implied by `actor.routing_replay=rollout` (docs/moe_routing_replay.md)."""

    gpu_memory_utilization: float = 0.5
    """Fraction of GPU memory vLLM may take for weights and KV cache (vLLM on GPU only)."""

    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    """Agent loops: tools, simulated users, turn limits."""

    server: ServerConfig = field(default_factory=ServerConfig)
    """Each replica's OpenAI-compatible HTTP server (`interface=server`)."""

    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    """Cross-process weight sync, used when the rollout has a pool of its own (`cluster.separate_pools`)."""

    max_replica_restarts: int = 3
    """With the rollout on a pool of its own: how many times over the run a replica whose process died is
    restarted on its bundle, given the current weights, and its generations redone; past it (or 0) the
    death ends the run with the error naming the replica. A colocated rollout is never restarted."""

    def __post_init__(self) -> None:
        SamplingConfig(self.temperature, self.top_p, self.top_k, self.n)  # same local checks
        require(
            1 <= self.graph_decode_steps <= 64,
            "graph_decode_steps",
            f"must lie in [1, 64], got {self.graph_decode_steps}",
            "use 1 (a token a replay) or a few, e.g. 4",
        )
        require(
            self.dtype is not Dtype.AUTO, "dtype", "auto is for <role>.mixed_precision only", "use float32"
        )
        require(
            0.0 < self.gpu_memory_utilization <= 1.0,
            "gpu_memory_utilization",
            f"must lie in (0, 1], got {self.gpu_memory_utilization}",
            "use e.g. 0.5 when the actor trains on the same GPU",
        )
        require(
            self.quantization in tuple(RolloutQuantization),
            "quantization",
            f"unknown quantization {self.quantization!r}",
            f"choose one of {[q.value for q in RolloutQuantization]}",
        )
        object.__setattr__(self, "quantization", RolloutQuantization(self.quantization))
        require(
            not (self.quantization is RolloutQuantization.FP8 and self.engine == RolloutEngineKind.VLLM),
            "quantization",
            "fp8 with rollout.engine=vllm is not supported yet: vLLM quantizes a checkpoint once after "
            "loading, and whether it re-quantizes the weights each step's sync writes into it is unchecked",
            "use rollout.engine=torch (quartet's engine re-quantizes every sync), or "
            "rollout.quantization=none",
        )
        require(self.max_num_seqs > 0, "max_num_seqs", "must be > 0")
        require(
            self.fused_kernels in tuple(FusedKernels),
            "fused_kernels",
            f"must be auto, off or on, got {self.fused_kernels!r}",
            "use auto (the Triton kernels on CUDA where they compile)",
        )
        require(self.kv_cache_tokens >= 0, "kv_cache_tokens", "must be >= 0", "use 0 for automatic sizing")
        require(self.tensor_parallel_size >= 1, "tensor_parallel_size", "must be >= 1")
        require(
            self.max_replica_restarts >= 0,
            "max_replica_restarts",
            f"must be >= 0, got {self.max_replica_restarts}",
            "use 0 to end the run when a replica dies",
        )

    @property
    def sampling(self) -> SamplingConfig:
        """The training sampling parameters as one object."""
        return SamplingConfig(self.temperature, self.top_p, self.top_k, self.n)
