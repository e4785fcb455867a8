"""The few run-wide values a role reads beyond its own config section, passed to it explicitly.

    actor = Actor(cfg.actor, RunValues(model_path, seed=0, ...), lora=cfg.model.lora)

A role is built from its own section (`ActorConfig`, `CriticConfig`, ...) and this object, never from the
whole `QuartetConfig`: what a role depends on is visible in its constructor, and a test builds a role
without a full config. The trainer slices both out of its config (`quartet.trainer.workers.start.role_specs`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunValues"]


@dataclass(frozen=True)
class RunValues:
    """Values of the run that several roles share."""

    model_path: str
    """The policy's model folder (the tiny model is built before any role starts)."""
    max_prompt_length: int
    """`data.max_prompt_length`: tokens of a prompt at most."""
    max_response_length: int
    """`data.max_response_length`: tokens of a response at most (also the loss's norm constant)."""
    prompts_per_step: int
    """`data.train_batch_size`: prompts per step, global (for the optimizer-step count of the lr schedule)."""
    responses_per_prompt: int
    """`rollout.n`: responses per prompt (a mini-batch of m prompts holds m x n rows)."""
    seed: int = 0
    """`trainer.seed`: model init and the mini-batch shuffling generators."""
    trainer_steps: int = 0
    """Steps of the run (for the lr schedule); 0 when the role never trains (export, tests)."""
    gradient_checkpointing: bool = False
    """`model.gradient_checkpointing` of the trained models."""
    remove_padding: bool = False
    """`model.remove_padding`: the policy's passes run on packed micro-batches."""
    shared_prompts: bool = True
    """`model.shared_prompts`: packed rows with one prompt run it once."""
    sequence_parallel_size: int = 1
    """`model.sequence_parallel_size`: devices per sequence group of the policy's passes (packed under it)."""
    tensor_parallel_size: int = 1
    """`model.tensor_parallel_size`: devices per tensor group of the policy's engine."""
    expert_parallel_size: int = 1
    """`model.expert_parallel_size`: devices per expert group of the policy's engines (actor, reference)."""
    fused_head: bool | None = None
    """`model.fused_head`: the policy's log-probs from the hidden states in vocabulary blocks (None: CUDA)."""
    freeze_vision_tower: bool = True
    """`model.freeze_vision_tower`: a vision-language policy trains its language model only."""
    gkd_coef: float = 0.0
    """`algorithm.gkd_coef`: > 0 adds GKD's JSD term to the actor's loss (`core.gkd`)."""
    gkd_beta: float = 0.5
    """`algorithm.gkd_beta`."""
    gkd_top_k: int = 16
    """`algorithm.gkd_top_k`: the teacher's tokens per position in GKD's support."""
    custom_module: str = ""
    """`algorithm.custom_module`: a user module that the actor's process imports for its registered losses,
    and the rollout's for its registered agent loops."""
    image_pixels: tuple[int, int] = (0, 0)
    """`data.min_pixels`, `data.max_pixels`: how a vision-language model's agent loops process the images
    tools return, as the prompt loader processed the prompt's (0: the processor's own)."""
