"""A GSM8K teacher: the simulated user checks each answer and asks for another try until it is right.

quartet's counterpart of verl's `Gsm8kInteraction` (a verl interaction file naming
`verl.interactions.gsm8k_interaction.Gsm8kInteraction` builds this one, `quartet.agents.verl_compat`):
per trajectory `start(ground_truth=...)` (the row's `extra_info.interaction_kwargs`); after each assistant
turn the turn's last number is compared with the ground truth (`quartet.agents.tools.gsm8k.gsm8k_score`):

    right  -> done, score 1.0, "Correct."
    wrong  -> not done, score 0.0, a request to check the work and answer again

The conversation's length is bounded by the agent loop's turn limits (`rollout.multi_turn`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from quartet.agents.interaction import Interaction, InteractionError, InteractionReply
from quartet.agents.tools.gsm8k import gsm8k_score

__all__ = ["RETRY", "Gsm8kInteraction"]

RETRY = "That answer is not right. Check your work and give your final answer again."


class Gsm8kInteraction(Interaction):
    """Checks the model's GSM8K answer each turn (module docstring)."""

    default_name: ClassVar[str] = "gsm8k"

    def __init__(self, *, name: str | None = None) -> None:
        super().__init__(name=name)

    async def start(self, instance_id: str | None = None, **kwargs: Any) -> str:
        if "ground_truth" not in kwargs:
            raise InteractionError(
                f"interaction {self.name!r} needs ground_truth in the row's extra_info.interaction_kwargs"
            )
        return await super().start(instance_id, **kwargs)

    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        state = self.instances.get(instance_id)
        if state is None:
            raise InteractionError(f"interaction {self.name!r}: no instance {instance_id!r} (start it first)")
        said = next(
            (str(m.get("content") or "") for m in reversed(messages) if m.get("role") == "assistant"), ""
        )
        score = gsm8k_score(said, state["ground_truth"])
        right = score == 1.0
        return InteractionReply("Correct." if right else RETRY, done=right, score=score)
