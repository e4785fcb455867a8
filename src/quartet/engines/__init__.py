"""The training engine: forward log-probs/entropy/values/scores, backward, optimizer, FSDP2, offload.

- `spec`: `EngineSpec` (what to load, how to train), `MicroSpec`, and the `LossFn` contract
  (`ModelOutputs`, `LossScale`).
- `engine`: `TrainingEngine`, the one class roles use.
- `micro`: micro-batch plans (fixed size, or first-fit-decreasing packing under a token budget).
- `inputs`: model inputs of a micro-batch (position ids from the attention mask, shared padding trimmed).
- `heads`: response log-probs, entropy and values from model outputs (alignment documented there).
- `packing`, `packed_run`, `ulysses`: packed micro-batches, one packed micro-batch through the model, and
  Ulysses sequence parallelism (the policy's and the critic's passes split by tokens).
- `build`: the engine's module in one direction: `model_init` (the model: head, LoRA, checkpointing,
  freezing), `model_check` (its heads against sp / tp), `ulysses` and `tensor_parallel` (the parallel
  split), `fsdp` (FSDP2 sharding); `hf_modules` holds the look-ups they share and imports none of them.
- `dist`, `optim`, `offload`, `checkpoint`: process group and meshes, AdamW + schedule, offloading, and
  state (sharded checkpoints, HF export); `elastic`: which saved rank's per-rank state a rank reads when a
  checkpoint is resumed on another world size.
"""

from typing import TYPE_CHECKING, Any

from quartet.engines.spec import EngineSpec, LossFn, LossScale, MicroSpec, ModelKind, ModelOutputs

if TYPE_CHECKING:
    from quartet.engines.engine import EngineStateError, TrainingEngine

_ENGINE_NAMES = ("EngineStateError", "TrainingEngine")


def __getattr__(name: str) -> Any:
    """`TrainingEngine` is imported on first use: it brings in transformers' models, FSDP2 and peft, which a
    process that only plans, dispatches or reads `spec` (the driver) never needs."""
    if name in _ENGINE_NAMES:
        from quartet.engines import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'quartet.engines' has no attribute '{name}'")


__all__ = [
    "EngineSpec",
    "EngineStateError",
    "LossFn",
    "LossScale",
    "MicroSpec",
    "ModelKind",
    "ModelOutputs",
    "TrainingEngine",
]
