"""The memory planner sizes a vision-language model: its language model, its vision tower's parameters and
the tower's activations (against autograd's saved tensors), for every role that runs it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from quartet.config import TinyModelConfig
from quartet.config.model import TinyArch
from quartet.models.loading import load_causal_lm, load_value_model
from quartet.planning.model_shape import HeadKind, shape_from_path, shape_from_tiny
from quartet.planning.vision import vision_activation_bytes, vision_shape_of


def test_planned_parameters_are_the_models(tiny_vlm_dir: Path) -> None:
    shape = shape_from_path(tiny_vlm_dir)
    model = load_causal_lm(tiny_vlm_dir)
    visual = sum(p.numel() for p in model.model.visual.parameters())
    assert shape.model_type == "qwen2_vl" and shape.vision_params == visual > 0
    assert shape.params() == sum(p.numel() for p in model.parameters())
    critic = load_value_model(tiny_vlm_dir)  # the VLM critic keeps the tower
    tiny = shape_from_tiny(TinyModelConfig(arch=TinyArch.QWEN2_VL))  # what `model.tiny` plans
    assert tiny.vision == shape.vision and tiny.vision_params == shape.vision_params
    assert shape.params(HeadKind.VALUE) == sum(p.numel() for p in critic.parameters())


def _tower(model_type: str, depth: int, width: int, heads: int) -> tuple[Any, Any]:
    """A small random Qwen2-VL / Qwen2.5-VL (its config and model), text model as small as it gets."""
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig, Qwen2VLConfig

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    text.update(
        num_key_value_heads=1,
        vocab_size=64,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3]},
    )
    if model_type == "qwen2_vl":
        vision = dict(depth=depth, embed_dim=width, num_heads=heads, mlp_ratio=3, hidden_size=32)
        config: Any = Qwen2VLConfig(vision_config=vision, text_config=text)
    else:
        vision = dict(depth=depth, hidden_size=width, num_heads=heads, intermediate_size=2 * width)
        vision.update(out_hidden_size=32, fullatt_block_indexes=[depth - 1], window_size=56)
        config = Qwen2_5_VLConfig(vision_config=vision, text_config=text)
    torch.manual_seed(0)
    return config, AutoModelForImageTextToText.from_config(config)


def _saved_bytes(model: Any, grid: tuple[int, int], autocast: bool) -> int:
    """Bytes autograd keeps through the trained tower: distinct storages of the saved tensors, parameters
    left out (they exist anyway), half-precision weight copies included."""
    visual = model.model.visual.requires_grad_(True)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    width = visual.config.in_channels * visual.config.temporal_patch_size * visual.config.patch_size**2
    h, w = grid
    pixels, thw = torch.randn(h * w, width), torch.tensor([[1, h, w]])
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = visual(pixels, grid_thw=thw)
    assert out.pooler_output.shape[0] == h * w // 4
    return sum(seen.values())


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("autocast", [False, True])
def test_the_trained_towers_saved_activations_are_counted(model_type: str, autocast: bool) -> None:
    """The planner's per-patch count against autograd's saved tensors, on two tower shapes and two images."""
    for depth, width, heads in ((2, 32, 2), (3, 48, 3)):
        config, model = _tower(model_type, depth, width, heads)
        params = sum(p.numel() for p in model.model.visual.parameters())
        shape = vision_shape_of(model_type, config.vision_config, params)
        c = 2 if autocast else 4
        for grid in ((8, 8), (16, 24)):
            tokens = grid[0] * grid[1] // 4
            planned = vision_activation_bytes(shape, tokens, c, trains=True)
            measured = _saved_bytes(model, grid, autocast)
            # float32: exact; bfloat16 autocast: within 0.2% (the weights' copies are planned for every
            # parameter; biases and norms are not cast)
            assert measured <= planned <= measured * 1.01, (depth, grid)


def test_the_planner_counts_the_towers_activations(tiny_vlm_dir: Path) -> None:
    """Every role that runs the tower gets its activations; a trained tower keeps more than a frozen one."""
    from quartet.config import load_config
    from quartet.config.roles import Role
    from quartet.planning.estimate import estimate_memory
    from quartet.planning.plan import Phase

    shape = shape_from_path(tiny_vlm_dir)
    assert shape.vision is not None and shape.vision.depth == 2 and shape.vision.width == 32
    base = [f"model.path={tiny_vlm_dir}", "algorithm.adv_estimator=gae", "actor.use_kl_loss=true"]
    base += ["data.max_prompt_length=64", "data.max_response_length=16"]
    plans = {
        frozen: estimate_memory(
            load_config(None, [*base, f"model.freeze_vision_tower={frozen}"]), device="cpu"
        )
        for frozen in ("true", "false")
    }
    rows = {(r.phase, r.role): r for r in plans["true"].rows}
    for key in [
        (Phase.GEN, Role.ROLLOUT),
        (Phase.OLD_LOG_PROB, Role.ACTOR),
        (Phase.REF, Role.REFERENCE),
        (Phase.VALUES, Role.CRITIC),
        (Phase.UPDATE_CRITIC, Role.CRITIC),
        (Phase.UPDATE_ACTOR, Role.ACTOR),
    ]:
        assert rows[key].breakdown["vision"] > 0, key
    trained = {(r.phase, r.role): r for r in plans["false"].rows}
    for key in [(Phase.UPDATE_ACTOR, Role.ACTOR), (Phase.UPDATE_CRITIC, Role.CRITIC)]:
        assert trained[key].breakdown["vision"] > rows[key].breakdown["vision"]
    # the critic keeps the tower: its weights count it, its optimizer only when the tower trains
    critic = rows[(Phase.VALUES, Role.CRITIC)].breakdown
    assert critic["weights"] == 4 * shape.params(HeadKind.VALUE)
    assert critic["optimizer"] == 8 * (shape.params(HeadKind.VALUE) - shape.vision_params)
    assert trained[(Phase.VALUES, Role.CRITIC)].breakdown["optimizer"] == 8 * shape.params(HeadKind.VALUE)


def test_the_fitter_never_proposes_sequence_parallelism_for_a_vlm(tiny_vlm_dir: Path) -> None:
    """Long rows make activations dominate, where the fitter splits a text model's tokens over a sequence
    group; a VLM's engines refuse sequence parallelism, so its proposal must not hold it."""
    from quartet.config import load_config
    from quartet.planning.estimate import estimate_memory
    from quartet.planning.fit import DOMINANT_SHARE, _grow_sp, activation_share
    from quartet.planning.role_shapes import RoleShapes

    overrides = ["cluster.backend=ray", "cluster.bundles_per_node=2", "data.max_prompt_length=256"]
    overrides += ["data.max_response_length=256", "rollout.n=8", "actor.micro_batch_size_per_device=16"]
    vlm = load_config(None, [*overrides, f"model.path={tiny_vlm_dir}"])
    shape = shape_from_path(tiny_vlm_dir)
    text = dataclasses.replace(shape, model_type="qwen2", vision=None, vision_params=0)
    for policy, splits in ((text, True), (shape, False)):
        shapes = RoleShapes(policy)
        assert activation_share(estimate_memory(vlm, device="gpu", shapes=shapes)) >= DOMINANT_SHARE
        assert bool(_grow_sp("gpu", shapes)(vlm)) is splits
