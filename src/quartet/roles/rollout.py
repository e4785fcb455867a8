"""The rollout role: an inference engine next to the actor in the same host process.

    launch(cluster, names, actor=RoleSpec(Actor, cfg.actor, run),
           rollout=RoleSpec(Rollout, cfg.rollout, run, trainer=Sibling("actor")))
    batch = rollout.generate(prompts)          # responses, response_mask, rollout_logprobs, ...
    rollout.sleep()                            # free the KV cache while the actor trains
    ... actor.update(batch) ...
    rollout.sync_weights()                     # the actor's new weights, in-process; wakes the engine

Weight sync needs no file and no network: the rollout object holds its sibling actor object (same
process), streams `inference_weights(actor.engine.module)` (FSDP2 shards gathered per parameter, LoRA
merged) into the engine's own model copy. Every rank does it at once (the gather is a collective), and
every rank's engine gets the full model: the engine is a tensor-parallel-1 replica per rank.

Seeds: a training step's requests are seeded from (rollout.seed, global step, data-parallel rank, row), so
a run is reproducible and no two rows of a step share a random stream.

Multi-turn (`rollout.multi_turn.enable`): `generate` runs the agent loops (`quartet.agents.runner`) over
this rank's rows, n trajectories per row, their turns batched together by the engine through the replica's
`OpenAIServer` (in-process token calls). With `rollout.mode=async` that server also listens on HTTP
(`server_url()`), so agent frameworks and other processes can drive the same engine; `sleep`/`wake` close
and reopen it with the engine (503 while training).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.rollout import RolloutConfig, RolloutMode, SamplingConfig, WeightApply
from quartet.core.batch import Batch
from quartet.engines.weight_export import inference_weights
from quartet.models.loading import load_tokenizer
from quartet.roles.run_values import RunValues
from quartet.roles.weight_stream import GenerationLock, WeightSubscriber
from quartet.rollout.base import RolloutEngine
from quartet.rollout.batch_io import generate_batch, pad_rollout
from quartet.rollout.factory import make_engine
from quartet.rollout.types import SamplingParams

if TYPE_CHECKING:
    from quartet.agents.runner import AgentRunner
    from quartet.roles.actor import Actor
    from quartet.serving import OpenAIServer, ServerThread

T = TypeVar("T")

__all__ = ["Rollout"]

log = logging.getLogger(__name__)

_STEP_STRIDE, _RANK_STRIDE = 1_000_003, 10_007  # primes: seeds of (step, rank, row) never collide in a run


class Rollout:
    """One engine replica per rank; generation, weight sync from the sibling actor, sleep/wake."""

    def __init__(self, cfg: RolloutConfig, run: RunValues, trainer: Actor | None = None) -> None:
        """`trainer`: the sibling actor whose weights `sync_weights` copies (`Sibling("actor")`)."""
        self.rc, self.max_response_length = cfg, run.max_response_length
        self.trainer = trainer
        model_path = run.model_path
        self.engine: RolloutEngine = make_engine(
            cfg.engine,
            model_path,
            cfg,
            max_model_len=run.max_prompt_length + run.max_response_length,
            dtype=getattr(torch, cfg.dtype.value),
            seed=cfg.seed,
        )
        self.pad_token_id = _pad_token_id(model_path)
        self.asleep = False
        self._busy: list[_Busy] = []
        self._generation = GenerationLock()  # one generation at a time, in arrival order; receives run beside
        self.subscriber = WeightSubscriber(self._load_version, self._generation, cfg.weight_sync.apply)
        self.server: OpenAIServer | None = None
        self.server_thread: ServerThread | None = None
        self.agents: AgentRunner | None = None
        if cfg.multi_turn.enable or cfg.mode is RolloutMode.ASYNC:
            self._start_server(model_path)

    def _start_server(self, model_path: str) -> None:
        """The replica's OpenAI-compatible server (HTTP in async mode) and the agent loops."""
        from quartet.agents.runner import AgentRunner
        from quartet.serving import OpenAIServer, ServerThread

        tokenizer: Any = load_tokenizer(model_path)
        sc = self.rc.server
        rank = int(os.environ.get("RANK", "0"))
        self.server = OpenAIServer(
            self.engine,
            tokenizer,
            sc.model_name,
            host=sc.host,
            port=sc.port + rank if sc.port else 0,
            api_key=sc.api_key or None,
            max_new_tokens_default=self.max_response_length,
            request_timeout_s=sc.request_timeout_s,
            max_n=sc.max_n,
            max_request_tokens=sc.max_request_tokens,
            max_body_bytes=sc.max_body_bytes,
        )
        if self.rc.mode is RolloutMode.ASYNC:
            self.server_thread = ServerThread(self.server)
            self.server_thread.start()
        if self.rc.multi_turn.enable:
            self.agents = AgentRunner.from_config(self.rc.multi_turn, tokenizer, self.max_response_length)

    def _on_server_loop(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run a coroutine of the server: on its HTTP loop when it has one, else on a loop of our own."""
        if self.server_thread is not None:
            return self.server_thread.call(coro, timeout_s)
        return asyncio.run(asyncio.wait_for(coro, timeout_s))

    @dispatch(Split.BROADCAST)
    def server_url(self) -> str | None:
        """This replica's base URL (`http://host:port/v1`); None unless rollout.mode=async."""
        return None if self.server is None or self.server_thread is None else self.server.url

    # ---- generation --------------------------------------------------------------------------------------

    @dispatch(Split.BY_DP_RANK)
    def generate(self, prompts: Batch, greedy: bool = False, first: bool = False) -> Batch:
        """Responses to this rank's prompt rows (`prompts`, `attention_mask` left-padded).

        Training batches sample `rollout.n` responses per prompt at the rollout temperature; batches with
        `meta.validation` use `rollout.val`; `greedy` gives one greedy response per prompt (ReMax's
        baseline). Output layout: `quartet.rollout.batch_io`, responses padded to `data.max_response_length`
        (the training engines trim the padding). Wakes the engine. Generations run one at a time in arrival
        order; `first` puts this one ahead of those waiting (a stale group generated again).
        """
        self._generation.acquire(first=first)
        try:
            self.subscriber.apply_pending()  # a version that arrived during the previous generation
            busy = _Busy(time.time())
            self._busy = [*self._busy[-_BUSY_KEPT:], busy]  # colocated runs never ask: keep it bounded
            try:
                return self._generate(prompts, greedy)
            finally:
                busy.end = time.time()
        finally:
            self._generation.release()

    @dispatch(Split.BROADCAST)
    def busy_intervals(self, since: float) -> list[tuple[float, float]]:
        """The (start, end) wall times (`time.time()`) this replica spent generating after `since`, the one
        in flight ending now: the driver's idle and overlap metrics."""
        now = time.time()
        spans = [(b.start, now if b.end is None else b.end) for b in list(self._busy)]
        return [(max(start, since), end) for start, end in spans if end > since]

    def _generate(self, prompts: Batch, greedy: bool) -> Batch:
        self.wake()
        sampling = self._sampling(prompts)
        if greedy:
            sampling = dataclasses.replace(sampling, temperature=0.0, n=1)
        start, version = time.perf_counter(), self.engine.weight_version
        if self.agents is not None and self.server is not None:
            out = self.agents.run(prompts, sampling, self.server.generate_tokens, self.pad_token_id)
            out = out.with_meta(temperature=sampling.temperature if sampling.temperature > 0 else 1.0)
        else:
            out = generate_batch(self.engine, prompts, sampling, self.pad_token_id)
        if "rollout_versions" not in out:  # an engine without per-token versions: the version at the start
            out = out.union(Batch({"rollout_versions": out["response_mask"] * version}))
        # every rank's responses as wide as the limit, so data-parallel ranks' batches join
        out = pad_rollout(out, out["prompts"].shape[1], sampling.max_new_tokens, self.pad_token_id)
        seconds = time.perf_counter() - start
        log.debug("generated %d responses in %.2f s (weights version %d)", len(out), seconds, version)
        return out.with_meta(global_step=prompts.meta.global_step, validation=prompts.meta.validation)

    def _sampling(self, prompts: Batch) -> SamplingParams:
        chosen: SamplingConfig = self.rc.val if prompts.meta.validation else self.rc.sampling
        rank = int(os.environ.get("RANK", "0"))
        seed = self.rc.seed + prompts.meta.global_step * _STEP_STRIDE + rank * _RANK_STRIDE
        if prompts.meta.validation:
            seed += _STEP_STRIDE // 2  # validation never replays a training step's stream
        return SamplingParams(
            temperature=chosen.temperature,
            top_p=chosen.top_p,
            top_k=chosen.top_k,
            n=chosen.n,
            max_new_tokens=self.max_response_length,
            seed=seed,
            return_logprobs=True,
        )

    # ---- weights and memory ------------------------------------------------------------------------------

    @dispatch(Split.BROADCAST)
    def sync_weights(self, version: int | None = None) -> dict[str, float]:
        """Copy the sibling actor's current weights into the engine (wakes it first), as weight `version`
        (the trainer's count of actor updates; None keeps the engine's); count and seconds."""
        if self.trainer is None:
            raise RuntimeError(
                "this Rollout has no trainer to sync from; construct it with trainer=Sibling('actor')"
            )
        self.wake()
        start = time.perf_counter()
        engine = self.trainer.engine
        was_offloaded = engine.offloaded
        if was_offloaded:
            engine.onload()
        try:
            count = self.engine.load_weights(inference_weights(engine.module), version=version)
        finally:
            if was_offloaded:
                engine.offload()
        return {"rollout/sync_tensors": float(count), "timing_s/weight_sync": time.perf_counter() - start}

    # ---- weights from an actor in another process (quartet.roles.weight_stream) -------------------------

    @dispatch(Split.BROADCAST)
    def join_weight_stream(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Join the actor's weight-sync group as receiver 1 + rank (blocks until the actor accepts)."""
        self.subscriber.join(host, port, world_size, timeout_s)

    @dispatch(Split.BROADCAST)
    def receive_weights(self, apply: WeightApply | None = None) -> dict[str, float]:
        """Take the next version the actor publishes, while generation goes on; apply it as configured
        (`apply` overrides `rollout.weight_sync.apply` for this version)."""
        return self.subscriber.receive(apply)

    @dispatch(Split.BROADCAST)
    def weight_version(self) -> int:
        """Version of the weights the engine holds now."""
        return self.engine.weight_version

    def _load_version(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> int:
        self.wake()
        return self.engine.load_weights(tensors, version=version)

    @dispatch(Split.BROADCAST)
    def sleep(self) -> None:
        """Free the KV cache (and weights where the engine can) until the next `generate`/`sync_weights`.

        With a server, it first refuses new requests (503) and waits for those in the engine to finish.
        """
        if self.asleep:
            return
        if self.server is not None:
            timeout = self.server.request_timeout_s + 30.0
            self._on_server_loop(self.server.sleep(offload_weights=False), timeout)
        else:
            self.engine.sleep(offload_weights=False)
        self.asleep = True

    @dispatch(Split.BROADCAST)
    def wake(self) -> None:
        """Undo `sleep` (the server admits requests again)."""
        if not self.asleep:
            return
        if self.server is not None:
            self._on_server_loop(self.server.wake(), 120.0)
        else:
            self.engine.wake()
        self.asleep = False

    @dispatch(Split.BROADCAST)
    def shutdown(self) -> None:
        """Stop the server (when there is one), then the engine."""
        try:
            self.subscriber.close()
            if self.server_thread is not None:
                self.server_thread.stop()
            elif self.server is not None:
                asyncio.run(asyncio.wait_for(self.server.stop(), 30.0))
        finally:
            self.engine.shutdown()


_BUSY_KEPT = 1000
"""Generation spans a replica keeps for `busy_intervals` (the driver asks every step)."""


@dataclasses.dataclass
class _Busy:
    """One generation's wall-clock span; `end` is None while it runs."""

    start: float
    end: float | None = None


def _pad_token_id(model_path: str) -> int:
    """The tokenizer's pad id (its end-of-sequence id when it has none), 0 without a tokenizer."""
    if not (Path(model_path) / "tokenizer_config.json").exists():
        return 0
    tok: Any = load_tokenizer(model_path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return int(pad or 0)
