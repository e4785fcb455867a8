"""The memory planner sizes a vision-language model: its language model and its vision tower's parameters."""

from __future__ import annotations

from pathlib import Path

from quartet.models.loading import load_causal_lm
from quartet.planning.model_shape import shape_from_path


def test_planned_parameters_are_the_models(tiny_vlm_dir: Path) -> None:
    shape = shape_from_path(tiny_vlm_dir)
    model = load_causal_lm(tiny_vlm_dir)
    visual = sum(p.numel() for p in model.model.visual.parameters())
    assert shape.model_type == "qwen2_vl" and shape.vision_params == visual > 0
    assert shape.params() == sum(p.numel() for p in model.parameters())
