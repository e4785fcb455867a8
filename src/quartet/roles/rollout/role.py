"""The rollout role: an inference engine next to the actor in the same host process.

    launch(cluster, names, actor=RoleSpec(Actor, cfg.actor, run),
           rollout=RoleSpec(Rollout, cfg.rollout, run, trainer=Sibling("actor")))
    batch = rollout.generate(prompts)          # responses, response_mask, rollout_logprobs, ...
    rollout.sleep()                            # free the KV cache while the actor trains
    ... actor.update(batch) ...
    rollout.sync_weights()                     # the actor's new weights, in-process; wakes the engine

The role holds an engine and a `Generator` (`generators`: single-turn, or the agent loops) and delegates;
its other jobs are objects of their own: the in-process weight sync from the sibling actor
(`sibling_sync.SiblingSync`: no file, no network), the subscriber to an actor in another process
(`quartet.roles.weight_stream.WeightSubscriber`), the OpenAI-compatible server (`server.ReplicaServer`) and
the generation spans (`busy.BusyLog`).

Seeds: a training step's requests are seeded from (rollout.seed, global step, data-parallel rank, row), so
a run is reproducible and no two rows of a step share a random stream.

Multi-turn (`rollout.multi_turn.enable`): the generator runs the agent loops (`quartet.agents.runner`) over
this rank's rows, n trajectories per row, their turns batched together by the engine through the replica's
`OpenAIServer` (in-process token calls). With `rollout.interface=server` that server also listens on HTTP
(`server_url()`), so agent frameworks and other processes can drive the same engine; `sleep`/`wake` close
and reopen it with the engine (503 while training).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.config.rollout import RolloutConfig, RolloutInterface, SamplingConfig, WeightApply
from quartet.core.batch import Batch
from quartet.core.registry import import_custom_module
from quartet.models.loading import load_tokenizer
from quartet.roles.rollout.busy import BusyLog
from quartet.roles.rollout.generators import AgentLoopGenerator, Generator, SingleTurnGenerator
from quartet.roles.rollout.sibling_sync import SiblingSync
from quartet.roles.run_values import RunValues
from quartet.roles.weight_stream import GenerationLock, WeightSubscriber
from quartet.rollout.base import RolloutEngine
from quartet.rollout.batch_io import pad_rollout
from quartet.rollout.factory import make_engine
from quartet.rollout.types import SamplingParams

if TYPE_CHECKING:
    from quartet.roles.actor import Actor
    from quartet.roles.rollout.server import ReplicaServer

__all__ = ["Rollout"]

log = logging.getLogger(__name__)

_STEP_STRIDE, _RANK_STRIDE = 1_000_003, 10_007  # primes: seeds of (step, rank, row) never collide in a run


class Rollout:
    """One engine replica per rank; generation, weight sync from the sibling actor, sleep/wake."""

    def __init__(self, cfg: RolloutConfig, run: RunValues, trainer: Actor | None = None) -> None:
        """`trainer`: the sibling actor whose weights `sync_weights` copies (`Sibling("actor")`)."""
        import_custom_module(run.custom_module)  # its registered agent loops, in this process too
        self.rc = cfg
        self.max_response_length = run.max_response_length
        self.image_pixels = run.image_pixels
        self.sibling = SiblingSync(trainer) if trainer is not None else None
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
        self.busy = BusyLog()
        self._generation = GenerationLock()  # one generation at a time, in arrival order; receives run beside
        self.subscriber = WeightSubscriber(self._load_version, self._generation, cfg.weight_sync.apply)
        self.server: ReplicaServer | None = None
        self.generator: Generator = SingleTurnGenerator(self.engine, self.pad_token_id)
        if cfg.multi_turn.enable or cfg.interface is RolloutInterface.SERVER:
            self._start_server(model_path)

    def _start_server(self, model_path: str) -> None:
        """The replica's OpenAI-compatible server (also on HTTP with `interface=server`); with multi-turn, the
        agent loops generate through it."""
        import quartet.environments  # noqa: F401 (registers the `environment` agent loop)
        from quartet.agents.runner import AgentRunner
        from quartet.roles.rollout.server import ReplicaServer

        tokenizer: Any = load_tokenizer(model_path)
        http = self.rc.interface is RolloutInterface.SERVER
        self.server = ReplicaServer(self.engine, tokenizer, self.rc.server, self.max_response_length, http)
        if self.rc.multi_turn.enable:
            processor = _image_processor(model_path, self.image_pixels)
            runner = AgentRunner.from_config(
                self.rc.multi_turn, tokenizer, self.max_response_length, processor
            )
            generate_tokens = self.server.server.generate_tokens
            self.generator = AgentLoopGenerator(runner, generate_tokens, self.pad_token_id)

    @dispatch(Split.BROADCAST)
    def server_url(self) -> str | None:
        """This replica's base URL (`http://host:port/v1`); None unless rollout.interface=server."""
        return None if self.server is None else self.server.url

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
            with self.busy.span():
                return self._generate(prompts, greedy)
        finally:
            self._generation.release()

    @dispatch(Split.BROADCAST)
    def busy_intervals(self, since: float) -> list[tuple[float, float]]:
        """The (start, end) wall times (`time.time()`) this replica spent generating after `since`, the one
        in flight ending now: the driver's idle and overlap metrics."""
        return self.busy.since(since)

    def _generate(self, prompts: Batch, greedy: bool) -> Batch:
        self.wake()
        sampling = self._sampling(prompts)
        if greedy:
            sampling = dataclasses.replace(sampling, temperature=0.0, n=1)
        start, version = time.perf_counter(), self.engine.weight_version
        out = self.generator.generate(prompts, sampling)
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
        if self.sibling is None:
            raise RuntimeError(
                "this Rollout has no trainer to sync from; construct it with trainer=Sibling('actor')"
            )
        self.wake()
        return self.sibling.copy_into(self.engine, version)

    # ---- weights from an actor in another process (quartet.roles.weight_stream) -------------------------

    @dispatch(Split.BROADCAST)
    def join_weight_stream(self, host: str, port: int, world_size: int, timeout_s: float) -> None:
        """Join the actor's weight-sync group as receiver 1 + rank (blocks until the actor accepts)."""
        self.subscriber.join(host, port, world_size, timeout_s)

    @dispatch(Split.BROADCAST)
    def leave_weight_stream(self) -> None:
        """Leave the weight-sync group (a replica died: the driver forms a new one, then joins us to it)."""
        self.subscriber.close()

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
            self.server.sleep()
        else:
            self.engine.sleep(offload_weights=False)
        self.asleep = True

    @dispatch(Split.BROADCAST)
    def wake(self) -> None:
        """Undo `sleep` (the server admits requests again)."""
        if not self.asleep:
            return
        if self.server is not None:
            self.server.wake()
        else:
            self.engine.wake()
        self.asleep = False

    @dispatch(Split.BROADCAST)
    def shutdown(self) -> None:
        """Stop the server (when there is one), then the engine."""
        try:
            self.subscriber.close()
            if self.server is not None:
                self.server.stop()
        finally:
            self.engine.shutdown()


def _pad_token_id(model_path: str) -> int:
    """The tokenizer's pad id (its end-of-sequence id when it has none), 0 without a tokenizer."""
    if not (Path(model_path) / "tokenizer_config.json").exists():
        return 0
    tok: Any = load_tokenizer(model_path)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return int(pad or 0)


def _image_processor(model_path: str, pixels: tuple[int, int]) -> Any:
    """A vision-language model's image processor (its agent loops carry images); None for a text model."""
    from quartet.models.loading import is_vision_model, load_image_processor

    return load_image_processor(model_path, *pixels) if is_vision_model(model_path) else None
