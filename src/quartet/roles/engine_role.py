"""The state methods every role that owns a `TrainingEngine` exposes to the driver, written once."""

from __future__ import annotations

from pathlib import Path

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
        """Model, optimizer, scheduler and RNG state of every rank under `folder`."""
        self.engine.save(Path(folder))

    @dispatch(Split.BROADCAST)
    def load(self, folder: str) -> None:
        self.engine.load(Path(folder))

    @dispatch(Split.BROADCAST)
    def export_hf(self, folder: str) -> str | None:
        """A Hugging Face folder of the full model (every rank gathers, rank 0 writes); its path on rank 0."""
        path = self.engine.export_hf(Path(folder))
        return str(path) if path is not None else None
