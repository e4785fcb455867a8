"""Weight sync from the sibling actor in the same process: no file, no network.

The rollout replica holds its colocated actor object (`trainer=Sibling("actor")`) and streams
`inference_weights(actor.engine.module)` (FSDP2 shards gathered per parameter, LoRA merged) into its
engine's own model copy. Every rank does it at once (the gather is a collective), and every rank's engine
gets the full model: the engine is a tensor-parallel-1 replica per rank.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from quartet.engines.weight_export import inference_weights
from quartet.rollout.base import RolloutEngine

if TYPE_CHECKING:
    from quartet.roles.actor import Actor

__all__ = ["SiblingSync"]


class SiblingSync:
    """Copies the sibling actor's current weights into a rollout engine."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor

    def copy_into(self, engine: RolloutEngine, version: int | None) -> dict[str, float]:
        """Load the actor's weights as `version` (None keeps the engine's); onloads an offloaded actor for
        the copy and offloads it again. Returns the tensor count and the seconds it took."""
        start = time.perf_counter()
        trainer = self.actor.engine
        was_offloaded = trainer.offloaded
        if was_offloaded:
            trainer.onload()
        try:
            count = engine.load_weights(inference_weights(trainer.module), version=version)
        finally:
            if was_offloaded:
                trainer.offload()
        return {"rollout/sync_tensors": float(count), "timing_s/weight_sync": time.perf_counter() - start}
