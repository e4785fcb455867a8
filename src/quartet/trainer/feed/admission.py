"""Admission control of the async feed: when a step's prompts may start generating, so that no token the
trainer consumes is more than `trainer.max_staleness` weight versions old (`trainer.staleness_control=
admission`, the default; `drop` keeps the older policy of dropping and regenerating stale groups).

    gate = AdmissionGate(max_staleness=1, buffer=2)
    gate.admits(step=6, taking=5)      # True: step 6 may start while the trainer takes step 5
    gate.admits(step=7, taking=5)      # False: it would be consumed 2 versions after its start

**The derivation.** The feed (`quartet.trainer.feed.rollout_feed`) starts prompts only inside `take(k)`, when
the trainer asks for step k's batch. Call v_k the trainer's weight version then (its count of actor
updates). Three facts of the loop:

1. Weights change only between steps: step k-1's update is followed by its sync to version v_k, and that
   sync returns only once every replica has applied v_k (`apply: between_steps`) or holds it pending to be
   applied before its next generation starts (`after_drain`). So every token of a batch started during
   `take(k)` carries a version >= v_k, however long the batch waits in the replicas' queue, whatever its
   responses' lengths, and whether or not a later sync lands in the middle of a response (partial
   rollouts only make tokens newer). An engine that does not tag tokens reports the version at the start of
   the generation, which is also >= v_k.
2. A step updates the actor at most once (none during `trainer.critic_warmup`), so the version that trains
   step s >= k is v_s <= v_k + (s - k).
3. A token's staleness is the trainer's version when its step trains minus the token's version.

Hence a token of step s, started during `take(k)`, is at most v_s - v_k <= s - k versions old, and the
rule "start step s during `take(k)` only if s - k <= max_staleness" bounds every consumed token by
construction: nothing is ever dropped. The bound is tight: when generation outruns training, a batch
started during `take(k)` is generated entirely with v_k and trained s - k versions later.

In the issue's terms (B groups per step): counted at the moment the trainer takes step k, the groups in
flight plus those buffered (step k's own included) are at most (max_staleness + 1) x B. With a fixed B the
two forms are the same rule; the step form is what the feed checks, since every group of a step starts
together (prompts are drawn in step order so that a resume draws the same prompts).

The buffer (`trainer.async_buffer`) still caps how far ahead batches may generate, so the feed keeps
`min(async_buffer, max_staleness)` batches generating ahead of the one it hands over. With max_staleness
0 each batch starts when its step asks for it (no overlap, every token on-policy). When the buffer is
deeper than the bound, the gate records how long admission held each batch back after the buffer had room
for it (`async/admission_wait_s`).
"""

from __future__ import annotations

__all__ = ["AdmissionGate"]


class AdmissionGate:
    """Which steps' prompts the feed may start, and how long admission held each one back.

    `max_staleness` None disables admission (the `drop` policy and one_step_off): the buffer alone decides.
    """

    def __init__(self, max_staleness: int | None, buffer: int) -> None:
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        if buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {buffer}")
        self.max_staleness = max_staleness
        self.buffer = buffer
        self._held_since: dict[int, float] = {}

    @property
    def ahead(self) -> int:
        """Batches that may generate ahead of the one the trainer takes."""
        return self.buffer if self.max_staleness is None else min(self.buffer, self.max_staleness)

    def admits(self, step: int, taking: int) -> bool:
        """May step `step`'s prompts start while the trainer takes step `taking` (weights of `taking`)?"""
        if step < taking:
            raise ValueError(f"step {step} is before the step being taken ({taking}): it cannot start now")
        return step - taking <= self.ahead

    def group_limit(self, groups_per_step: int) -> int | None:
        """The most groups in flight plus buffered (the taken step's included) when a step is taken: the
        rule in groups, (min(buffer, max_staleness) + 1) x groups per step; None without admission."""
        if self.max_staleness is None:
            return None
        return (self.ahead + 1) * groups_per_step

    def hold(self, step: int, now: float) -> None:
        """The buffer had room for `step` at `now`, but admission refused it (the first time counts)."""
        self._held_since.setdefault(step, now)

    def start(self, step: int, now: float) -> float:
        """`step` starts at `now`: the seconds admission held it back (0 if it never did)."""
        since = self._held_since.pop(step, None)
        return 0.0 if since is None else max(0.0, now - since)
