"""The built-in engine's log-probs of image prompts against the training engine's (fp32): the same M-RoPE
positions, the same image features, whatever the micro-batching."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine


@pytest.mark.parametrize(
    ("micro", "packed"),
    [
        (MicroSpec(size=100), False),
        (MicroSpec(size=1), False),
        (MicroSpec(max_tokens=60), False),
        (MicroSpec(size=100), True),  # model.remove_padding: rows packed, M-RoPE positions packed too
        (MicroSpec(max_tokens=60), True),
    ],
)
def test_engine_and_trainer_logprobs_agree_on_image_prompts(
    tiny_vlm_dir: Path, rollout: Batch, micro: MicroSpec, packed: bool
) -> None:
    spec = EngineSpec(str(tiny_vlm_dir), ModelKind.CAUSAL_LM, Dtype.FLOAT32, remove_padding=packed)
    engine = TrainingEngine(spec)
    config: Any = engine.module.config
    assert engine.spec.packs is packed and config.vision_config._attn_implementation == "sdpa"
    assert (config.text_config._attn_implementation == "quartet_varlen") is packed
    logprobs, _ = engine.forward_logprobs(rollout, 1.0, micro)
    mask = rollout["response_mask"].bool()
    diff = (logprobs - rollout["rollout_logprobs"]).abs()[mask]
    assert mask.sum() > 20
    assert float(diff.max()) <= 1e-5


def test_images_change_the_logprobs(tiny_vlm_dir: Path, rollout: Batch) -> None:
    """The trainer reads the images: swapping two rows' pixels changes their log-probs."""
    engine = TrainingEngine(EngineSpec(str(tiny_vlm_dir), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    rows = rollout.index([0, 9])  # a red square and a yellow one, each one image of 16 tokens
    mm: Any = list(rows.non_tensors["multi_modal_inputs"])
    assert mm[0]["image_grid_thw"].tolist() == mm[1]["image_grid_thw"].tolist()
    swapped = Batch(rows.tensors, {**rows.non_tensors, "multi_modal_inputs": mm[::-1]}, rows.meta)
    base, _ = engine.forward_logprobs(rows, 1.0, MicroSpec(size=2))
    other, _ = engine.forward_logprobs(swapped, 1.0, MicroSpec(size=2))
    mask = rows["response_mask"].bool()
    assert float((base - other).abs()[mask].max()) > 1e-4


def test_rollout_rows_carry_their_own_images(rollout: Batch) -> None:
    """Each sample keeps its prompt's images (bytes for the inspector, pixels for the passes)."""
    counts = [len(x) for x in rollout.non_tensors["images"]]
    assert counts == [1] * 3 + [2] * 3 + [0] * 3 + [1] * 3
    grids = [
        m["image_grid_thw"].shape[0] if m is not None else 0
        for m in rollout.non_tensors["multi_modal_inputs"]
    ]
    assert grids == counts
    assert all(x[:8] == b"\x89PNG\r\n\x1a\n" for row in rollout.non_tensors["images"] for x in row)


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_vision_tower(tiny_vlm_dir: Path, freeze: bool) -> None:
    from quartet.config.optim import OptimConfig

    spec = EngineSpec(
        str(tiny_vlm_dir),
        ModelKind.CAUSAL_LM,
        Dtype.FLOAT32,
        optim=OptimConfig(lr=1e-3),
        freeze_vision_tower=freeze,
    )
    engine = TrainingEngine(spec)
    trainable = {n for n, p in engine.module.named_parameters() if p.requires_grad}
    visual = {n for n, _ in engine.module.named_parameters() if n.startswith("model.visual.")}
    assert visual and any(n.startswith("model.language_model.") for n in trainable)
    assert (visual & trainable) == (set() if freeze else visual)
    assert engine.optimizer is not None
    in_optimizer = sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"])
    assert in_optimizer == sum(p.numel() for n, p in engine.module.named_parameters() if n in trainable)
