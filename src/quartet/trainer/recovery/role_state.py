"""The roles' side of a checkpoint: the actor's (and critic's) state saved into and restored from their
folders, the rollout brought to the restored weights, and the final policy exported."""

from __future__ import annotations

from pathlib import Path

from quartet.config import Role
from quartet.roles.actor import Actor
from quartet.roles.critic import Critic
from quartet.trainer.recovery.checkpoint import CheckpointError
from quartet.trainer.workers.start import Workers
from quartet.trainer.workers.weight_sync import WeightSync

__all__ = ["export_policy", "restore_roles", "save_roles"]


def save_roles(workers: Workers, folder: Path) -> list[str]:
    """Every trained role's state under `folder`, one sub-folder per role; their names."""
    workers.actor.call(Actor.save, str(folder / Role.ACTOR))
    saved = [Role.ACTOR]
    if workers.critic is not None:
        workers.critic.call(Critic.save, str(folder / Role.CRITIC))
        saved.append(Role.CRITIC)
    return [str(role) for role in saved]


def restore_roles(
    workers: Workers, weights: WeightSync, checkpoint: Path, saved_roles: list[str], weight_version: int
) -> None:
    """Roles' state from `checkpoint` (which holds `saved_roles`), then the rollout engine gets the
    restored actor's weights, numbered `weight_version`."""
    has_critic = workers.critic is not None
    if (Role.CRITIC in saved_roles) != has_critic:
        raise CheckpointError(
            f"{checkpoint} has roles {saved_roles}, but this run {'has' if has_critic else 'has no'} "
            "critic (algorithm.adv_estimator changed?). Fix: resume with the checkpoint's algorithm, or "
            "trainer.resume=off"
        )
    workers.actor.call(Actor.load, str(checkpoint / Role.ACTOR))
    if workers.critic is not None:
        workers.critic.call(Critic.load, str(checkpoint / Role.CRITIC))
    weights.sync(weight_version)


def export_policy(workers: Workers, folder: Path) -> None:
    """The actor's weights as a Hugging Face model folder."""
    workers.actor.call(Actor.export_hf, str(folder))
