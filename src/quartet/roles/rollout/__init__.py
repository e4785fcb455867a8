"""The rollout role (`Rollout`, in `role`) and the small objects it delegates to.

    role           Rollout: the driver-facing methods (generate, weight sync, sleep/wake, shutdown)
    generators     Generator: single-turn generation or the agent loops (tool loop, simulated user)
    server         ReplicaServer: the OpenAI-compatible server (agent loops, rollout.interface=server)
    sibling_sync   SiblingSync: weights from the colocated actor, in-process
    busy           BusyLog: the spans spent generating (the driver's idle and overlap metrics)

Weights from an actor in another process arrive through `quartet.roles.weight_stream.WeightSubscriber`.
"""

from __future__ import annotations

from quartet.roles.rollout.role import Rollout

__all__ = ["Rollout"]
