"""The weight sync to vLLM splits a trainer's fused expert tensors into the checkpoint's per-expert weights:
the same names and values as transformers' own save_pretrained writes (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quartet.models.loading import load_causal_lm
from quartet.rollout.vllm_support import CheckedWeights, checkpoint_shapes


def test_fused_experts_become_the_checkpoints_per_expert_weights(moe_model_dir: Path) -> None:
    model = load_causal_lm(moe_model_dir)
    with torch.no_grad():  # distinct values per expert and row, so a swapped half or expert shows
        for p in model.parameters():
            p.copy_(torch.randn(p.shape))
    folder = moe_model_dir.parent / "moe_saved"
    model.save_pretrained(folder)
    saved = {}
    for file in folder.glob("*.safetensors"):
        saved.update(load_file(file))
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in saved  # transformers writes one per expert
    state = model.state_dict()
    stream = CheckedWeights(state.items(), checkpoint_shapes(folder))
    sent = dict(stream)
    assert stream.problem is None and stream.count == len(state)
    assert set(sent) - set(saved) <= {"lm_head.weight"}  # tied: the head by its own name (checkpoint_shapes)
    assert set(saved) <= set(sent)
    for name, value in saved.items():
        torch.testing.assert_close(sent[name], value, atol=0, rtol=0, msg=name)


def test_an_expert_tensor_of_the_wrong_shape_is_refused(moe_model_dir: Path) -> None:
    shapes = checkpoint_shapes(moe_model_dir)
    assert shapes is not None
    bad = torch.zeros(4, 3, 64)  # [E, 2I, H] with a wrong 2I
    stream = CheckedWeights([("model.layers.0.mlp.experts.gate_up_proj", bad)], shapes)
    assert list(stream) == []
    with pytest.raises(ValueError, match="gate_up_proj"):
        raise stream.problem  # type: ignore[misc]
