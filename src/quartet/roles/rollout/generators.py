"""How a rollout replica turns a batch of prompts into a batch of responses: the role's `Generator` seam.

The role (and the driver behind it) never knows whether generation is single-turn or an agent loop: it
derives the sampling parameters, hands `prompts` to its generator and pads what comes back.

    SingleTurnGenerator   one response per sample, straight from the engine's batch (`generate_batch`)
    AgentLoopGenerator    one trajectory per sample (`quartet.agents.runner`): each row's loop, by its
                          `agent_name`, is the tool loop (`tool_agent`), the interaction loop with a
                          simulated user (`user_sim`) or one chat turn (`single_turn`); all trajectories of
                          the batch run concurrently, their turns batched by the engine through the
                          replica's server; a vision-language model's turns carry their images

Both return the rollout Batch of `quartet.rollout.batch_io` (the agent loop adds its per-row columns,
`quartet.agents.batch`), not yet padded to the response limit.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from quartet.core.batch import Batch
from quartet.rollout.base import RolloutEngine
from quartet.rollout.batch_io import generate_batch
from quartet.rollout.types import SamplingParams

if TYPE_CHECKING:
    from quartet.agents.runner import AgentRunner, GenerateTokens

__all__ = ["AgentLoopGenerator", "Generator", "SingleTurnGenerator"]


class Generator(abc.ABC):
    """Responses to a batch of prompt rows (`prompts`, `attention_mask` left-padded, non-tensor columns)."""

    @abc.abstractmethod
    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        """`sampling.n` responses per row, row-major, as the rollout Batch."""


class SingleTurnGenerator(Generator):
    """Each row's prompt ids go to the engine as they are; one generation per sample."""

    def __init__(self, engine: RolloutEngine, pad_token_id: int) -> None:
        self.engine = engine
        self.pad_token_id = pad_token_id

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        return generate_batch(self.engine, prompts, sampling, self.pad_token_id)


class AgentLoopGenerator(Generator):
    """Each row's chat messages go through its agent loop; turns reach the engine via `generate_tokens`."""

    def __init__(self, runner: AgentRunner, generate_tokens: GenerateTokens, pad_token_id: int) -> None:
        self.runner = runner
        self.generate_tokens = generate_tokens
        self.pad_token_id = pad_token_id

    def generate(self, prompts: Batch, sampling: SamplingParams) -> Batch:
        images = prompts.non_tensors.get("multi_modal_inputs")
        if images is not None and any(row is not None for row in images) and self.runner.env.images is None:
            raise NotImplementedError(
                "the agent loops of this replica have no image processor, so they would drop the rows' "
                "images: build the runner with the model's image processor (AgentRunner.from_config(..., "
                "image_processor)) or train image rows single-turn (rollout.multi_turn off)"
            )
        out = self.runner.run(prompts, sampling, self.generate_tokens, self.pad_token_id)
        # the temperature the trainer rescales logits by; a greedy batch's log-probs are those of T = 1
        return out.with_meta(temperature=sampling.temperature if sampling.temperature > 0 else 1.0)
