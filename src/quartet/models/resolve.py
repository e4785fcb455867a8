"""Which model folder a run trains: `model.path`, or the tiny model built from `model.tiny` (RL and SFT)."""

from __future__ import annotations

from pathlib import Path

from quartet.config import QuartetConfig

__all__ = ["resolve_model"]


def resolve_model(cfg: QuartetConfig) -> str:
    """`model.path`, or the tiny model of `model.tiny` built once under `<output_dir>/models`."""
    if cfg.model.path:
        return cfg.model.path
    from quartet.models.tiny import ensure_tiny_model

    return str(ensure_tiny_model(cfg.model.tiny, Path(cfg.trainer.output_dir) / "models"))
