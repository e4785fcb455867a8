"""verl's KL and aggregation names load unchanged; `full` is refused with the reason and the fix."""

from __future__ import annotations

import pytest

from quartet.config import ConfigError, load_config

VERL_KL_NAMES = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
VERL_KL_NAMES += ["kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"]


@pytest.mark.parametrize("name", VERL_KL_NAMES)
def test_every_verl_kl_name_loads(name: str) -> None:
    cfg = load_config(overrides=[f"algorithm.kl_penalty={name}", f"actor.kl_loss_type={name}"])
    assert str(cfg.algorithm.kl_penalty) == name
    assert str(cfg.actor.kl_loss_type) == name


@pytest.mark.parametrize("key", ["algorithm.kl_penalty", "actor.kl_loss_type"])
def test_full_is_refused_with_reason_and_fix(key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{key}=full"])
    assert info.value.field == key
    assert "vocabulary" in str(info.value) and "fix" in str(info.value)


VERL_AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


@pytest.mark.parametrize("mode", [*VERL_AGG_MODES, "token-sum"])
def test_every_verl_loss_agg_mode_loads(mode: str) -> None:
    assert str(load_config(overrides=[f"actor.loss_agg_mode={mode}"]).actor.loss_agg_mode) == mode
