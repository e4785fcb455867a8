"""The built-in PyTorch rollout engine: continuous batching on CPU or GPU with no extra dependency.

A background thread (`quartet.rollout.engine_thread`, shared with the vLLM engine) owns the `EngineCore`
and runs steps while there is work; callers submit requests and wait on futures. So `generate` (a batch)
and many concurrent `generate_one` calls (agent loops) all feed the same running batch. Weight updates
and sleep/wake take the step lock, hence happen between two steps.

A request is checked before it is queued (`InvalidRequestError` for that caller alone), a sequence that
makes a step raise fails its own request only (see `quartet.rollout.torch.engine_core`), and no caller
waits on a dead engine thread: the thread fails every pending future when it dies, and waits poll its
liveness, so a wait raises `EngineStateError` instead of hanging.

Usage:
    engine = TorchRolloutEngine.from_pretrained(folder, max_num_seqs=64)
    outs = engine.generate([GenerationRequest(ids, SamplingParams(temperature=1.0, n=4, seed=0))])
    engine.load_weights(trainer_model.named_parameters())
    engine.shutdown()
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from quartet.config.rollout import RolloutConfig, RolloutQuantization
from quartet.rollout.base import EngineStateError
from quartet.rollout.engine_thread import EngineThread, settle
from quartet.rollout.threaded_engine import ThreadedEngine
from quartet.rollout.torch.engine_core import EngineCore
from quartet.rollout.torch.fp8 import quantize_for_engine, quantize_layers
from quartet.rollout.torch.grammar import GrammarCompiler
from quartet.rollout.torch.graph_decode import BucketedDecoder
from quartet.rollout.torch.kernels import select_kernels
from quartet.rollout.torch.model_runner import DecoderRunner
from quartet.rollout.torch.sequence import SequenceState
from quartet.rollout.torch.stopping import StopChecker
from quartet.rollout.types import GenerationOutput, GenerationRequest
from quartet.rollout.validation import check_request
from quartet.rollout.weights import load_named_tensors

if TYPE_CHECKING:  # importing quartet.rollout stays free of transformers until a model is loaded
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["TorchRolloutEngine"]

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    """A submitted request: its future and the samples finished so far."""

    future: Future[list[GenerationOutput]]
    outputs: list[GenerationOutput | None] = field(default_factory=list)
    remaining: int = 0


def _eos_ids(model: Any, tokenizer: PreTrainedTokenizerBase | None) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        if eos is not None:
            ids.update([eos] if isinstance(eos, int) else eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids


class TorchRolloutEngine(ThreadedEngine):
    """Batched generation with a KV cache, continuous batching and prefix sharing, in plain PyTorch."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        max_num_seqs: int = 64,
        max_model_len: int | None = None,
        max_prefill_tokens: int = 8192,
        seed: int = 0,
        eos_token_ids: Iterable[int] | None = None,
        num_threads: int | None = None,
        max_n: int | None = None,
        cuda_graphs: bool = True,
        record_routing: bool = False,
        quantization: RolloutQuantization | str = RolloutQuantization.NONE,
        fused_kernels: str = "auto",
        graph_decode_steps: int = 1,
    ) -> None:
        """Wrap `model` (used as is: same device, dtype and weights, so a trainer may share it, unless
        `quantization` changes it).

        max_num_seqs: sequences decoded together. max_model_len: prompt + response limit (default: the
        model's context). max_prefill_tokens: padded prompt tokens prefilled in one forward. seed: source of
        the seeds of requests that bring none. eos_token_ids: default stop ids (default: the model's and
        tokenizer's end-of-sequence ids). num_threads: intra-op threads of the engine's thread (with
        PyTorch's usual OpenMP build this is per thread, so a trainer in the same process keeps its own
        setting; on a busy shared CPU, 1 thread is often much faster than 2). None keeps the default.
        max_n: most samples per request (None: no cap); a request over it raises `InvalidRequestError`.
        cuda_graphs: on a CUDA device, replay decode steps from CUDA graphs captured per bucketed shape
        (`quartet.rollout.torch.graph_decode`), `graph_decode_steps` tokens a replay for a plain batch
        (`rollout.graph_decode_steps`); False decodes eagerly. No effect on CPU.
        record_routing: an MoE model's outputs carry the top-k experts of every token fed (`routed_experts`,
        `routing_record`; inside the CUDA graphs too); a dense model raises ValueError.
        quantization: `fp8` replaces the decoder layers' projections of `model` with fp8 ones, in place
        (`quantization.fp8`; then the model is the engine's own: never pass a trainer's model with it).
        fused_kernels: `rollout.fused_kernels`, the decode step's Triton kernels (auto, off or on;
        `quartet.rollout.torch.kernels.select_kernels`). No effect on CPU under auto.
        The tokenizer is only needed for stop strings and grammars (`SamplingParams.grammar`).
        """
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.model = model
        self.tokenizer = tokenizer
        self.quantization = RolloutQuantization(quantization)
        self.runner = self._build_runner(model, record_routing, fused_kernels)
        eos = set(eos_token_ids) if eos_token_ids is not None else _eos_ids(model, tokenizer)
        self.stop_checker = StopChecker(eos, tokenizer)
        self.core = self._build_core(
            max_num_seqs, max_model_len, max_prefill_tokens, seed, max_n, cuda_graphs, graph_decode_steps
        )
        self._pending: dict[str, _Pending] = {}  # request id -> its future, guarded by the thread's cond
        self._asleep = False
        self._home_device: torch.device | None = None
        self._num_threads = num_threads
        self._thread = self._engine_thread()

    def _engine_thread(self) -> EngineThread[GenerationRequest]:
        """The thread that steps the core while requests wait (`quartet.rollout.engine_thread`)."""
        return EngineThread(
            "quartet-rollout",
            step=self._step,
            has_work=self.core.has_work,
            on_death=self._fail_all,
            on_start=self._on_thread_start,
        )

    def _build_runner(
        self, model: PreTrainedModel, record_routing: bool, fused_kernels: str
    ) -> DecoderRunner:
        """The runner over `model`: fp8 projections when asked, routing recorded, the decode kernels."""
        runner = DecoderRunner(model)
        if self.quantization is RolloutQuantization.FP8:  # none left where from_pretrained quantized them
            quantize_for_engine(runner.layers, runner.device)
        runner.record_routing(record_routing)
        runner.kernels = select_kernels(fused_kernels, runner.device)
        return runner

    def _build_core(
        self,
        max_num_seqs: int,
        max_model_len: int | None,
        max_prefill_tokens: int,
        seed: int,
        max_n: int | None,
        cuda_graphs: bool,
        graph_decode_steps: int = 1,
    ) -> EngineCore:
        """The core that steps `self.runner`: sequences capped by the model's own context, decode steps
        replayed from CUDA graphs where asked and on a CUDA device."""
        limit = self.runner.max_model_len
        if max_model_len is not None:
            limit = min(max_model_len, limit)
        graphs = cuda_graphs and self.runner.device.type == "cuda"
        return EngineCore(
            self.runner,
            self.stop_checker,
            max_num_seqs=max_num_seqs,
            max_model_len=limit,
            max_prefill_tokens=max_prefill_tokens,
            seed=seed,
            max_n=max_n,
            decoder=BucketedDecoder(
                self.runner, max_num_seqs, capture=True, steps_per_replay=graph_decode_steps
            )
            if graphs
            else None,
            grammars=None
            if self.tokenizer is None
            else GrammarCompiler(self.tokenizer, self.runner.vocab_size),
        )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        tokenizer_path: str | Path | None = None,
        **engine_kwargs: Any,
    ) -> TorchRolloutEngine:
        """An engine over the causal LM saved in the local folder `path` (tokenizer from the same folder)."""
        from quartet.models.loading import load_causal_lm, load_tokenizer

        model = load_causal_lm(path, dtype=dtype)
        if RolloutQuantization(engine_kwargs.get("quantization", "none")) is RolloutQuantization.FP8:
            # onto the device one projection at a time: the 16-bit projections never all sit there
            quantize_layers(DecoderRunner(model).layers, device)
        nn.Module.to(model, device)
        model.train(False)  # inference: no dropout
        tok_folder = Path(tokenizer_path or path)
        tokenizer = load_tokenizer(tok_folder) if (tok_folder / "tokenizer_config.json").exists() else None
        return cls(model, tokenizer, **engine_kwargs)

    @classmethod
    def from_config(
        cls, cfg: RolloutConfig, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None = None
    ) -> TorchRolloutEngine:
        """An engine over `model` sized by the rollout config (`max_num_seqs`, `kv_cache_tokens`, `seed`)."""
        max_len = cfg.kv_cache_tokens // cfg.max_num_seqs if cfg.kv_cache_tokens else None
        return cls(
            model,
            tokenizer,
            max_num_seqs=cfg.max_num_seqs,
            max_model_len=max_len,
            seed=cfg.seed,
            cuda_graphs=cfg.cuda_graphs,
            record_routing=cfg.record_routing,
            quantization=cfg.quantization,
            fused_kernels=cfg.fused_kernels,
            graph_decode_steps=cfg.graph_decode_steps,
        )

    # ---- generation ---------------------------------------------------------------------------------------

    def _validate(self, request: GenerationRequest) -> None:
        """Raise `InvalidRequestError` (a ValueError) before `request` can reach the batch."""
        check_request(request, self.core.limits)
        self.stop_checker.validate(request.sampling)

    def _submit(self, request: GenerationRequest) -> Future[list[GenerationOutput]]:
        future: Future[list[GenerationOutput]] = Future()

        def admit() -> None:  # under the thread's lock, so no other submission interleaves
            if self._asleep:
                raise EngineStateError("the engine is asleep: call wake() before generating")
            if request.request_id in self._pending:
                raise ValueError(f"request id '{request.request_id}' is already in flight")
            n = request.sampling.n
            self._pending[request.request_id] = _Pending(future, [None] * n, n)

        self._thread.submit(request, admit)
        return future

    # ---- on the engine thread -----------------------------------------------------------------------------

    def _on_thread_start(self) -> None:
        if self._num_threads is not None:
            torch.set_num_threads(self._num_threads)

    def _step(self, inbox: list[GenerationRequest], aborts: list[str]) -> None:
        self._deliver(self._run_step(inbox, aborts))

    def _run_step(self, inbox: list[GenerationRequest], aborts: list[str]) -> list[SequenceState]:
        finished: list[SequenceState] = []
        for request in inbox:
            try:
                self.core.add(request)
            except Exception as exc:  # checked at submission; still, it fails this request alone
                self._fail_request(request.request_id, exc)
        try:
            for request_id in aborts:
                finished += self.core.abort(request_id)
            if self.core.has_work():
                finished += self.core.step()
        except Exception as exc:  # fail the callers, not the thread: the engine stays usable
            log.exception("rollout engine step failed; failing every request in flight")
            self.core.abort_all()
            self._fail_all(exc)
            return []
        return finished

    def _fail_request(self, request_id: str, exc: BaseException) -> None:
        with self._thread.cond:
            pending = self._pending.pop(request_id, None)
        if pending is not None:
            settle(pending.future, error=exc)

    def _deliver(self, finished: list[SequenceState]) -> None:
        for seq in finished:  # a failed sample fails its request; its siblings arrive aborted, unused
            if seq.error is not None:
                self._fail_request(seq.request.request_id, seq.error)
        with self._thread.cond:
            for seq in finished:
                pending = self._pending.get(seq.request.request_id)
                if pending is None:
                    continue
                pending.outputs[seq.sample_index] = seq.to_output()
                pending.remaining -= 1
                if pending.remaining == 0:
                    del self._pending[seq.request.request_id]
                    settle(pending.future, [o for o in pending.outputs if o is not None])

    def _fail_all(self, exc: BaseException) -> None:
        with self._thread.cond:
            pending, self._pending = self._pending, {}
        self._thread.take_queued()
        for p in pending.values():
            settle(p.future, error=exc)

    # ---- weights and memory -------------------------------------------------------------------------------

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> int:
        """Copy trainer weights into the model between two steps; returns the number of tensors copied.

        With `version`, tokens generated from the next step on carry it (`GenerationOutput.versions`):
        the load and the new version take effect together, never inside one forward pass.
        """
        with self._thread.step_lock:
            count = load_named_tensors(self.model, named_tensors)
            if version is not None:
                self.core.weight_version = version
            return count

    @property
    def weight_version(self) -> int:
        """Version of the weights the engine holds (0 until a load names one)."""
        return self.core.weight_version

    def sleep(self, offload_weights: bool = False) -> None:
        """Free the KV cache (and move the weights to CPU with `offload_weights`); the engine must be idle."""
        with self._thread.step_lock, self._thread.cond:
            if self.core.has_work() or self._thread.has_queued():
                raise EngineStateError("cannot sleep while requests are in flight; wait for them first")
            self.core.free_cache()
            if offload_weights and self.runner.device.type != "cpu":
                self._home_device = self.runner.device
                nn.Module.to(self.model, "cpu")
            self._asleep = True

    def wake(self) -> None:
        """Weights back on their device; the KV cache is allocated again by the next request."""
        with self._thread.step_lock, self._thread.cond:
            if self._home_device is not None:
                nn.Module.to(self.model, self._home_device)
                self._home_device = None
            self._asleep = False

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes the KV cache holds now (0 while asleep)."""
        return self.core.cache.nbytes()

    def shutdown(self) -> None:
        """Abort what is in flight (callers get ABORT outputs), stop the thread, free the cache."""
        if self._thread.closing:
            return
        if not self._thread.stop():  # a step is wedged and holds the step lock: fail the callers, leave it
            self._fail_all(EngineStateError("the engine shut down while its thread was stuck in a step"))
            return
        with self._thread.step_lock:
            for request in self._thread.take_queued():
                self.core.add(request)
            finished = self.core.abort_all()
            self.core.free_cache()
        self._deliver(finished)
