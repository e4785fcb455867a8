"""The state methods every role that owns a `TrainingEngine` exposes to the driver, written once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from quartet.cluster.dispatch import Split, dispatch
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
        """Restore what `save` wrote (model and optimizer may come from another world size; the role state
        is per rank and is restored only when this rank's file is there)."""
        self.engine.load(Path(folder))
        path = Path(folder) / f"role_rank{self.engine.ctx.rank}.pt"
        if path.exists():
            self.load_role_state(torch.load(path, weights_only=True))

    def role_state(self) -> dict[str, Any]:
        """State of the role beyond its engine's that an exact resume needs (override)."""
        return {}

    def load_role_state(self, state: dict[str, Any]) -> None:
        """Restore a `role_state()` (override)."""

    @dispatch(Split.BROADCAST)
    def export_hf(self, folder: str) -> str | None:
        """A Hugging Face folder of the full model (every rank gathers, rank 0 writes); its path on rank 0."""
        path = self.engine.export_hf(Path(folder))
        return str(path) if path is not None else None
