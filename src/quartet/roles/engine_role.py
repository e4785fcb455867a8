"""The state methods every role that owns a `TrainingEngine` exposes to the driver, written once."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from quartet.cluster.dispatch import Split, dispatch
from quartet.engines.elastic import derived_seed, elastic_source

if TYPE_CHECKING:
    from quartet.engines import TrainingEngine

__all__ = ["EngineRole"]


class EngineRole:
    """Offload, checkpoint and export of `self.engine`, declared for the driver (subclasses set `engine`)."""

    engine: TrainingEngine

    @dispatch(Split.BROADCAST)
    def offload(self) -> None:
        """Parameters / optimizer states to host memory (as the role's offload switches say)."""
        self.engine.offload()

    @dispatch(Split.BROADCAST)
    def onload(self) -> None:
        self.engine.onload()

    @dispatch(Split.BROADCAST)
    def save(self, folder: str) -> None:
        """Model, optimizer, scheduler and RNG state of every rank under `folder`, and the role's own state
        (`role_state`: e.g. the mini-batch shuffling generator) as `role_rank{r}.pt`."""
        self.engine.save(Path(folder))
        torch.save(self.role_state(), Path(folder) / f"role_rank{self.engine.ctx.rank}.pt")

    @dispatch(Split.BROADCAST)
    def load(self, folder: str) -> None:
        """Restore what `save` wrote. Model and optimizer may come from another world size or layout; the
        role state follows `quartet.engines.elastic`: this rank's file where the checkpoint has one, else
        saved rank 0's (its counters) with the role's random streams seeded from (seed, step, rank)."""
        self.engine.load(Path(folder))
        rank = self.engine.ctx.rank
        try:
            source = elastic_source(Path(folder), "role_rank", rank)
        except FileNotFoundError:
            return  # written by a role without state files
        self.load_role_state(torch.load(source.path, weights_only=True))
        if not source.own:
            self.fresh_streams(derived_seed(self.engine.spec.seed, self.engine.steps, rank, "role"))

    def role_state(self) -> dict[str, Any]:
        """State of the role beyond its engine's that an exact resume needs (override)."""
        return {}

    def load_role_state(self, state: dict[str, Any]) -> None:
        """Restore a `role_state()` (override)."""

    def fresh_streams(self, seed: int) -> None:
        """Seed the role's own random streams from `seed`: this rank has none in the checkpoint, which was
        written on a smaller world (override where `role_state` holds a generator)."""

    @dispatch(Split.BROADCAST)
    def export_hf(self, folder: str) -> str | None:
        """A Hugging Face folder of the full model (every rank gathers, rank 0 writes); its path on rank 0."""
        path = self.engine.export_hf(Path(folder))
        return str(path) if path is not None else None
