"""The MoE routing record of one multi-turn trajectory, kept turn by turn (routing replay, R3).

Each model turn is one engine call on the whole conversation so far: the engine prefills every token of it
(prompt, earlier model turns, tool and user turns) and then decodes the new turn. Its record
(`GenerationOutput.routed_experts`) covers [prompt_len + R - 1] positions: the prefilled ones, then each
generated token but the last. A position processed by several turns gets one record by this rule:

- a model-written token keeps the routing it was generated with: the decode step that fed it, in the turn
  that wrote it (its weights, when a weight sync came between turns: `Trajectory.versions`);
- every other token (the first prompt, tool and user turns, the last token of each model turn, which its own
  turn sampled but never fed) takes the latest prefill that computed it: the routing under which the later
  turns' tokens were generated.

A prefix-caching engine would not recompute earlier tokens at all; the rule keeps what such an engine keeps
for model tokens (their decode), and the built-in engine has no such cache. A trajectory that ends on an
environment turn (its token budget spent) holds tokens no engine call processed: they stay unrecorded
(`covered` < the trajectory's length), and no trained log-prob depends on them (they come after every
model token). docs/moe_routing_replay.md, "Multi-turn".
"""

from __future__ import annotations

import torch

__all__ = ["RoutingTrack"]


class RoutingTrack:
    """Per position of prompt + response, the [L, k] experts chosen by the rule of the module docstring."""

    def __init__(self) -> None:
        self.record: torch.Tensor | None = None
        """[covered, L, k] the chosen records of positions 0 .. covered - 1 (None before the first turn)."""
        self.decoded: torch.Tensor = torch.zeros(0, dtype=torch.bool)
        """[covered] True where the record is a model token's own decode step (never replaced)."""

    @property
    def covered(self) -> int:
        """Positions from the start that have a record."""
        return 0 if self.record is None else int(self.record.shape[0])

    def add_turn(self, prompt_len: int, generated: int, record: torch.Tensor) -> None:
        """Merge the record [prompt_len + generated - 1, L, k] of one engine call: a prompt of `prompt_len`
        tokens (the conversation so far) and `generated` new model tokens."""
        want = prompt_len + generated - 1
        if record.dim() != 3 or record.shape[0] != want:
            raise ValueError(
                f"a routing record of {tuple(record.shape)} for a prompt of {prompt_len} tokens and "
                f"{generated} generated ones (expected [{want}, L, k])"
            )
        if self.covered > prompt_len:
            raise ValueError(
                f"the trajectory's record covers {self.covered} positions, the prompt only {prompt_len}"
            )
        merged = record.detach().cpu().clone()
        if self.record is not None:
            if self.record.shape[1:] != merged.shape[1:] or self.record.dtype != merged.dtype:
                raise ValueError(
                    f"routing records of one trajectory differ in shape or dtype: {tuple(self.record.shape)} "
                    f"{self.record.dtype} vs {tuple(merged.shape)} {merged.dtype}"
                )
            keep = self.decoded.nonzero().squeeze(1)
            merged[keep] = self.record[keep]
        decoded = torch.zeros(want, dtype=torch.bool)
        decoded[: self.covered] = self.decoded
        decoded[prompt_len:] = True  # this turn's generated tokens but its last, each fed by a decode step
        self.record = merged
        self.decoded = decoded

    def cut(self, length: int) -> None:
        """Forget positions from `length` on (the trajectory was cut or rebased there)."""
        if self.record is not None and self.covered > length:
            self.record = self.record[:length]
            self.decoded = self.decoded[:length]
