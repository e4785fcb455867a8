"""Cross-field rules: batch sizes that must divide over the data-parallel world, and friends."""

from __future__ import annotations

import pytest

from quartet.config import ConfigError, load_config


def _divides(prompts: int, n: int, mini: int, world: int, micro: int) -> bool:
    """The rule written out the slow way: split responses mini-batch by mini-batch, device by device."""
    if prompts % mini:
        return False
    per_minibatch = mini * n
    if per_minibatch % world:
        return False
    return (per_minibatch // world) % micro == 0


@pytest.mark.parametrize("prompts", [4, 6, 8])
@pytest.mark.parametrize("mini", [1, 2, 3, 4])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("micro", [1, 2, 4])
def test_batch_divisibility_matches_independent_rule(prompts: int, mini: int, world: int, micro: int) -> None:
    overrides = [
        f"data.train_batch_size={prompts}",
        "rollout.n=2",
        f"actor.mini_batch_size={mini}",
        f"actor.micro_batch_size_per_device={micro}",
        f"cluster.bundles_per_node={world}",
    ]
    if _divides(prompts, 2, mini, world, micro):
        load_config(overrides=overrides)
    else:
        with pytest.raises(ConfigError) as info:
            load_config(overrides=overrides)
        assert info.value.field.startswith("actor.")
        assert "fix" in str(info.value)


def test_non_dividing_mini_batch_names_field_and_divisors() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.train_batch_size=8", "actor.mini_batch_size=3"])
    assert info.value.field == "actor.mini_batch_size"
    assert "[1, 2, 4, 8]" in info.value.fix


def test_mini_batch_not_splitting_over_world() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            overrides=["rollout.n=3", "actor.mini_batch_size=1", "data.train_batch_size=1", "cluster.nodes=2"]
        )
    assert info.value.field == "actor.mini_batch_size"
    assert "world_size=2" in info.value.problem


def test_micro_batch_not_dividing_names_per_device_count() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["actor.micro_batch_size_per_device=3"])
    assert info.value.field == "actor.micro_batch_size_per_device"
    assert "16 responses each device" in info.value.problem  # 4 prompts x 4 samples / 1 device
    assert "use_dynamic_batch" in info.value.fix


def test_dynamic_batch_skips_micro_rule_but_needs_room_for_one_sequence() -> None:
    load_config(overrides=["actor.micro_batch_size_per_device=3", "actor.use_dynamic_batch=true"])
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["actor.use_dynamic_batch=true", "actor.max_tokens_per_micro_batch=50"])
    assert info.value.field == "actor.max_tokens_per_micro_batch"
    assert ">= 96" in info.value.fix  # 64 prompt + 32 response tokens


def test_critic_rules_apply_only_with_gae() -> None:
    load_config(overrides=["critic.mini_batch_size=3"])  # GRPO: no critic, not checked
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["critic.mini_batch_size=3", "algorithm.adv_estimator=gae"])
    assert info.value.field == "critic.mini_batch_size"


def test_group_estimators_need_several_samples() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["rollout.n=1", "actor.micro_batch_size_per_device=4"])
    assert info.value.field == "rollout.n"
    load_config(
        overrides=[
            "rollout.n=1",
            "actor.micro_batch_size_per_device=4",
            "algorithm.adv_estimator=reinforce_plus_plus",
        ]
    )


def test_lengths_must_fit_the_tiny_model() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["data.max_response_length=1000"])
    assert info.value.field == "data.max_response_length"
    assert "model.tiny.max_position_embeddings" in info.value.fix


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            overrides=["actor.mini_batch_size=3", "actor.use_kl_loss=true", "algorithm.use_kl_in_reward=true"]
        )
    text = str(info.value)
    assert "2 config problems" in text
    assert "actor.mini_batch_size" in text and "actor.use_kl_loss" in text


def test_overlong_buffer_must_be_shorter_than_the_response_limit() -> None:
    with pytest.raises(ConfigError, match="reward.overlong_buffer") as info:
        load_config(None, ["reward.overlong_buffer=32", "data.max_response_length=32"])
    assert "below 32" in str(info.value)
    cfg = load_config(None, ["reward.overlong_buffer=8", "data.max_response_length=32"])
    assert cfg.reward.overlong_buffer == 8


def test_separate_pools_names_roles_and_needs_ray() -> None:
    with pytest.raises(ConfigError, match=r"(?s)cluster\.separate_pools.*'actor'.*actor always stays"):
        load_config(None, ["cluster.separate_pools=[actor]"])
    with pytest.raises(ConfigError, match=r"(?s)cluster\.separate_pools.*backend=local"):
        load_config(None, ["cluster.separate_pools=[critic]", "cluster.backend=local"])
    cfg = load_config(None, ["cluster.separate_pools=[critic,reward_model]"])
    assert cfg.cluster.separate_pools == ("critic", "reward_model")
    assert load_config(None, ["cluster.separate_pools=[rollout]"]).cluster.separate_pools == ("rollout",)


def test_overlapping_modes_need_a_rollout_pool_and_plain_sampling() -> None:
    with pytest.raises(ConfigError, match=r"(?s)trainer\.mode.*separate_pools=\[rollout\]"):
        load_config(None, ["trainer.mode=async"])
    with pytest.raises(ConfigError, match=r"(?s)algorithm\.filter_groups.*trainer\.mode=sync"):
        load_config(
            None,
            ["trainer.mode=one_step_off", "cluster.separate_pools=[rollout]", "algorithm.filter_groups=true"],
        )
    cfg = load_config(
        None, ["trainer.mode=async", "cluster.separate_pools=[rollout]", "trainer.max_staleness=2"]
    )
    assert (cfg.trainer.mode, cfg.trainer.max_staleness) == ("async", 2)
