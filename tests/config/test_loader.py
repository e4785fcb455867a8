"""YAML + override loading: conversions, round trips, and errors that name the field and the fix."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from quartet.config import (
    ConfigError,
    Logger,
    QuartetConfig,
    RolloutEngineKind,
    RolloutInterface,
    iter_field_docs,
    load_config,
    to_yaml,
)
from quartet.config.loader import load_saved_config, upgrade_renamed_keys
from quartet.config.yaml_io import load_yaml
from quartet.core.choices import AdvantageEstimator


def _load_text(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> QuartetConfig:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return load_config(path, overrides)


def test_defaults_validate() -> None:
    assert load_config() == QuartetConfig()


def test_default_yaml_round_trip_is_exact(tmp_path: Path) -> None:
    cfg = QuartetConfig()
    text = to_yaml(cfg)
    assert _load_text(tmp_path, text) == cfg
    assert to_yaml(_load_text(tmp_path, text)) == text


def test_non_default_yaml_round_trip_is_exact(tmp_path: Path) -> None:
    cfg = load_config(
        overrides=[
            "actor.optim.lr=3e-7",
            "actor.optim.betas=[0.8,0.95]",
            "algorithm.adv_estimator=gae",
            "trainer.loggers=[console,jsonl,tensorboard]",
            "trainer.resume=off",
            "data.train_files=[a.parquet, b.jsonl]",
            "rollout.val.temperature=0.7",
            "cluster.cpus_per_bundle=0.5",
        ]
    )
    again = _load_text(tmp_path, to_yaml(cfg))
    assert again == cfg
    assert again.actor.optim.lr == 3e-7
    assert again.actor.optim.betas == (0.8, 0.95)


def test_override_types_are_converted() -> None:
    cfg = load_config(
        overrides=[
            "actor.optim.lr=1e-5",  # YAML 1.1 would read this as a string
            "rollout.n=8",
            "trainer.resume=off",  # YAML 1.1 would read this as False
            "trainer.experiment_name=2024",  # a string field keeps the text
            "algorithm.adv_estimator=RLOO",  # enums by value or name, any case
            "rollout.engine=vllm",
            "trainer.loggers=[console, wandb]",
            "model.lora.target_modules=[q_proj]",
            "algorithm.gamma=1",  # an int where a float is expected
        ]
    )
    assert cfg.actor.optim.lr == pytest.approx(1e-5) and isinstance(cfg.actor.optim.lr, float)
    assert cfg.rollout.n == 8
    assert cfg.trainer.resume == "off"
    assert cfg.trainer.experiment_name == "2024"
    assert cfg.algorithm.adv_estimator is AdvantageEstimator.RLOO
    assert cfg.rollout.engine is RolloutEngineKind.VLLM
    assert cfg.trainer.loggers == (Logger.CONSOLE, Logger.WANDB)
    assert cfg.model.lora.target_modules == ("q_proj",)
    assert cfg.algorithm.gamma == 1.0 and isinstance(cfg.algorithm.gamma, float)


def test_overrides_apply_in_order_over_the_file(tmp_path: Path) -> None:
    cfg = _load_text(
        tmp_path, "rollout:\n  n: 2\nactor:\n  optim:\n    lr: 0.001\n", ("rollout.n=8", "rollout.n=16")
    )
    assert cfg.rollout.n == 16
    assert cfg.actor.optim.lr == 0.001


def test_section_override_changes_only_named_keys() -> None:
    cfg = load_config(overrides=["rollout.top_p=0.9", "rollout.val={temperature: 0.5}"])
    assert cfg.rollout.val.temperature == 0.5
    assert cfg.rollout.val.n == 1  # untouched default
    assert cfg.rollout.top_p == 0.9


@pytest.mark.parametrize(
    ("override", "field", "suggestion"),
    [
        ("actor.optim.lrr=1e-5", "actor.optim.lrr", "actor.optim.lr"),
        ("actor.lr=1e-5", "actor.lr", "actor.optim.lr"),  # same leaf elsewhere in the tree
        ("rolout.n=4", "rolout", "rollout"),
        ("rollout.temprature=0.5", "rollout.temprature", "rollout.temperature"),
    ],
)
def test_unknown_key_names_closest_known_key(override: str, field: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    err = info.value
    assert err.field == field
    assert f"'{suggestion}'" in err.fix
    assert override in str(err)  # the message says which override caused it


def test_unknown_key_in_yaml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, "trainer:\n  total_step: 10\n")
    assert info.value.field == "trainer.total_step"
    assert "trainer.total_steps" in info.value.fix
    assert str(tmp_path / "run.yaml") in str(info.value)


@pytest.mark.parametrize(("old", "new"), [("async", "server"), ("sync", "batch")])
def test_renamed_key_names_the_new_key_and_value(tmp_path: Path, old: str, new: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"rollout.mode={old}"])
    from_override = info.value
    with pytest.raises(ConfigError) as info:
        _load_text(tmp_path, f"rollout:\n  mode: {old}\n")
    from_yaml = info.value
    for err in (from_override, from_yaml):
        assert err.field == "rollout.mode"
        assert "renamed to rollout.interface (sync -> batch, async -> server)" in err.problem
        assert err.fix == f"write rollout.interface={new}"
    assert str(tmp_path / "run.yaml") in str(from_yaml)
    assert f"rollout.mode={old}" in str(from_override)


def test_renamed_key_in_a_section_override_and_with_an_unknown_value() -> None:
    with pytest.raises(ConfigError, match=r"rollout\.mode: renamed to rollout\.interface") as info:
        load_config(overrides=["rollout={mode: async, n: 2}"])
    assert info.value.fix == "write rollout.interface=server"
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["rollout.mode=fast"])
    assert info.value.fix == "write rollout.interface instead (batch, server)"


def test_rollout_interface_loads_from_yaml_and_override(tmp_path: Path) -> None:
    assert load_config().rollout.interface is RolloutInterface.BATCH
    assert load_config(overrides=["rollout.interface=server"]).rollout.interface is RolloutInterface.SERVER
    cfg = _load_text(tmp_path, "rollout:\n  interface: server\n")
    assert cfg.rollout.interface is RolloutInterface.SERVER
    assert "interface: server" in to_yaml(cfg)


@pytest.mark.parametrize(
    ("override", "field", "expected"),
    [
        ("rollout.n=four", "rollout.n", "an integer"),
        ("rollout.n=2.5", "rollout.n", "an integer"),
        ("actor.optim.lr=fast", "actor.optim.lr", "a number"),
        ("data.shuffle=maybe", "data.shuffle", "true or false"),
        ("data.shuffle=1", "data.shuffle", "true or false"),
        ("trainer.loggers=console", "trainer.loggers", "a list"),
        ("model.lora=5", "model.lora", "a section"),
    ],
)
def test_wrong_type_names_field_and_expected_type(override: str, field: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert info.value.field == field
    assert expected in info.value.problem
    assert info.value.fix


def test_bad_enum_lists_choices() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["algorithm.adv_estimator=grpoo"])
    assert info.value.field == "algorithm.adv_estimator"
    assert "'grpo'" in info.value.fix and "'gae'" in info.value.fix


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("actor.optim.lr=-1", "actor.optim.lr"),
        ("rollout.top_p=1.5", "rollout.top_p"),
        ("data.max_response_length=0", "data.max_response_length"),
        ("actor.dual_clip_c=0.5", "actor.dual_clip_c"),
        ("rollout.val.temperature=-0.1", "rollout.val.temperature"),
        ("cluster.nodes=0", "cluster.nodes"),
        ("model.tiny.num_attention_heads=5", "model.tiny.num_attention_heads"),
    ],
)
def test_impossible_value_names_the_full_field_path(override: str, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert info.value.field == field
    assert override in str(info.value)


def test_malformed_override_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["rollout.n"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(overrides=["rollout.n.x=1"])


def test_yaml_scalars_follow_yaml_1_2() -> None:
    assert load_yaml("a: 1e-5\nb: off\nc: true\nd: 1.5\ne: .inf\nf: 7") == {
        "a": 1e-5,
        "b": "off",
        "c": True,
        "d": 1.5,
        "e": float("inf"),
        "f": 7,
    }


def test_every_field_is_documented() -> None:
    undocumented = [path for path, doc in iter_field_docs(QuartetConfig) if not doc]
    assert undocumented == []


def test_every_batch_size_field_says_what_it_counts() -> None:
    checked = 0
    for path, doc in iter_field_docs(QuartetConfig):
        leaf = path.rsplit(".", 1)[-1]
        if re.search(r"batch_size|max_tokens_per_micro_batch", leaf):
            checked += 1
            assert re.search(r"prompts|responses|token", doc, re.I), f"{path}: does not say what it counts"
            assert re.search(r"global|per device|one device", doc, re.I), f"{path}: global or per device?"
    assert checked >= 10


def test_configs_are_frozen() -> None:
    cfg = QuartetConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.rollout.n = 3  # type: ignore[misc]


def test_override_that_is_not_yaml_names_the_field_and_the_fix() -> None:
    from quartet.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="rollout.n") as info:
        load_config(None, ["rollout.n=[+,-,*]"])
    assert "not valid YAML" in str(info.value) and "override #1" in str(info.value)


@pytest.mark.parametrize(("old", "new"), [("async", "server"), ("sync", "batch")])
def test_a_saved_config_reads_a_renamed_key_under_its_new_name(tmp_path: Path, old: str, new: str) -> None:
    """A checkpoint's own config.yaml written before the rename stays loadable (`quartet export`)."""
    saved = tmp_path / "config.yaml"
    text = to_yaml(load_config(overrides=["rollout.n=2"])).replace("interface: batch", f"mode: {old}")
    assert f"mode: {old}" in text and "interface:" not in text  # the file an older quartet wrote
    saved.write_text(text)
    cfg = load_saved_config(saved)
    assert cfg.rollout.interface == RolloutInterface(new)
    assert cfg.rollout.n == 2
    with pytest.raises(ConfigError, match="renamed to rollout.interface"):
        load_config(str(saved))  # a user's config with the old key still fails


def test_upgrading_leaves_a_tree_without_old_keys_alone() -> None:
    tree = {"rollout": {"interface": "server", "n": 2}, "trainer": {"mode": "async"}}
    assert upgrade_renamed_keys(tree) == []
    assert tree == {"rollout": {"interface": "server", "n": 2}, "trainer": {"mode": "async"}}
    odd = {"rollout": {"mode": "fast"}}
    assert upgrade_renamed_keys(odd) == [("rollout.mode", "rollout.interface")]
    assert odd == {"rollout": {"interface": "fast"}}  # an unknown value is left for validation to refuse
