"""The training engine: forward log-probs/entropy/values/scores, backward, optimizer, FSDP2, offload.

- `spec`: `EngineSpec` (what to load, how to train), `MicroSpec`, and the `LossFn` contract
  (`ModelOutputs`, `LossScale`).
- `engine`: `TrainingEngine`, the one class roles use.
- `micro`: micro-batch plans (fixed size, or first-fit-decreasing packing under a token budget).
- `inputs`: model inputs of a micro-batch (position ids from the attention mask, shared padding trimmed).
- `heads`: response log-probs, entropy and values from model outputs (alignment documented there).
- `packing`, `packed_run`, `ulysses`: packed micro-batches, one packed micro-batch through the model, and
  Ulysses sequence parallelism (the policy's and the critic's passes split by tokens).
- `model_init`, `dist`, `optim`, `offload`, `checkpoint`: model building, FSDP2, AdamW + schedule,
  offloading, and state (sharded checkpoints, HF export).
"""

from quartet.engines.engine import EngineStateError, TrainingEngine
from quartet.engines.spec import EngineSpec, LossFn, LossScale, MicroSpec, ModelKind, ModelOutputs

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
