"""The chaos soak's `resize` fault: the driver is SIGKILLed and the run resumes on another world size.

The soak's async run has one bundle per pool; a resize toggles `cluster.bundles_per_node` between 1 and 2
(the actor trains on 1 or 2 ranks, the rollout runs 1 or 2 replicas), with the actor's micro-batch cut to
what one device of the new world gets (16 responses per mini-batch over 1 or 2 devices). The change stays
in the driver's overrides, so the later restarts (other faults, the final run) keep the new world until the
next resize. The resumed run names the change in its log and in its `resume` record ("the world changed
from 1 rank(s) (dp1) to 2 rank(s) (dp2): ..."); the soak's end checks (every step once, every prompt once
per epoch in the sampler's order) hold across it because the sampler's position is the driver's, not a
rank's (docs/reliability.md, "Elastic resume").
"""

from __future__ import annotations

WORLDS = (1, 2)
RESPONSES_PER_MINI_BATCH = 16  # chaos_config: actor.mini_batch_size=4 prompts x rollout.n=4
_KEYS = ("cluster.bundles_per_node=", "actor.micro_batch_size_per_device=")


def current_world(overrides: list[str]) -> int:
    """The bundles per node the overrides ask for (1 when they do not say)."""
    given = [o.split("=", 1)[1] for o in overrides if o.startswith(_KEYS[0])]
    return int(given[-1]) if given else 1


def resize(overrides: list[str]) -> tuple[int, int]:
    """Switch `overrides` (in place) to the other world of `WORLDS`; (old world, new world)."""
    old = current_world(overrides)
    new = WORLDS[(WORLDS.index(old) + 1) % len(WORLDS)] if old in WORLDS else WORLDS[0]
    overrides[:] = [o for o in overrides if not o.startswith(_KEYS)]
    overrides += [f"{_KEYS[0]}{new}", f"{_KEYS[1]}{RESPONSES_PER_MINI_BATCH // new}"]
    return old, new
