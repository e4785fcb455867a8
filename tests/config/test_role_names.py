"""`Role`: the role names a config gives (`cluster.separate_pools`) are parsed into the enum from YAML and
override strings, case-insensitively, and a misspelt one is refused naming the field and the choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.config import ConfigError, Role, load_config, plan_step, to_yaml


def test_separate_pools_are_roles_from_yaml_and_overrides(tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("cluster:\n  separate_pools: [Critic, REWARD_MODEL]\n")
    cfg = load_config(str(run), [])
    assert cfg.cluster.separate_pools == (Role.CRITIC, Role.REWARD_MODEL)
    assert all(type(role) is Role for role in cfg.cluster.separate_pools)
    assert "separate_pools:\n  - critic\n  - reward_model\n" in to_yaml(cfg)  # written back as plain names
    cfg = load_config(None, ["cluster.separate_pools=[rollout]"])
    assert cfg.cluster.separate_pools == (Role.ROLLOUT,) and cfg.cluster.separate_pools[0] == "rollout"


def test_a_misspelt_role_names_the_field_and_the_roles() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, ["cluster.separate_pools=[critc]"])
    message = str(info.value)
    assert "cluster.separate_pools[0]" in message and "'critc' is not a valid choice" in message
    assert all(role.value in message for role in Role)


def test_plan_roles_are_roles_in_start_order() -> None:
    cfg = load_config(None, ["algorithm.adv_estimator=gae"])
    assert plan_step(cfg).roles == (Role.ACTOR, Role.ROLLOUT, Role.CRITIC)
