"""benchmarks/moe_cost.py: its two models are the examples' (equal active parameters), and its smoke measures
every figure of both (no bound on them: the figures are in benchmarks/results/moe_cost.json)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_smoke import finite_positive, run_smoke

from quartet.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_models_are_the_examples_and_their_active_parameters_match() -> None:
    from moe_cost import MODELS, ROUTER

    from quartet.planning.model_shape import shape_from_tiny

    dense = load_config(str(ROOT / "examples" / "grpo_arithmetic" / "config.yaml"))
    moe = load_config(str(ROOT / "examples" / "moe" / "config.yaml"))
    assert MODELS["dense"] == dense.model.tiny and MODELS["moe"] == moe.model.tiny
    assert {
        "moe_aux_loss_coef": moe.actor.moe_aux_loss_coef,
        "moe_z_loss_coef": moe.actor.moe_z_loss_coef,
    } == ROUTER
    shapes = {name: shape_from_tiny(spec) for name, spec in MODELS.items()}
    assert shapes["dense"].total_params == 1_050_752
    assert (shapes["moe"].active_params, shapes["moe"].total_params) == (1_054_080, 3_413_376)


@pytest.mark.slow
def test_moe_cost_smoke(tmp_path: Path) -> None:
    result = run_smoke("moe_cost.py", tmp_path)
    figures = ("update_s", "small_update_s", "logprob_s", "update_peak_mib", "param_mib", "adam_mib")
    figures += ("decode_tok_s",)
    for name in ("dense", "moe", "moe_over_dense"):
        assert all(finite_positive(result["summary"][name][k]) for k in figures), name
    # the exact bytes: every expert's weights and Adam's two moments, float32
    assert result["summary"]["dense"]["param_mib"] * 2**20 == 4 * 1_050_752
    assert result["summary"]["moe"]["param_mib"] * 2**20 == 4 * 3_413_376
    for name in ("dense", "moe"):  # Adam's two moments per weight, and one float32 step count per tensor
        moments = 2 * result["summary"][name]["param_mib"] * 2**20
        assert moments < result["summary"][name]["adam_mib"] * 2**20 <= moments + 4 * 1000
    assert len(result["raw"]["moe"]["update_s"]) == result["settings"]["turns"] == 2
