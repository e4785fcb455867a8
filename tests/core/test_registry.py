"""The user registries: registration rules, lookup errors, the config's check of registered names, and a
registered policy loss / estimator reached through quartet's own entry points."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import torch

from quartet.config import ConfigError, load_config
from quartet.core import registry
from quartet.core.advantages import AdvantageInputs, AdvantageOutput, AdvantageParams, compute_advantages
from quartet.core.choices import LossAggMode
from quartet.core.policy_loss import ClipParams, TokenLosses, compute_policy_loss


def _unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"  # registrations are process-wide: never reuse a name


def test_builtin_names_cannot_be_shadowed_and_duplicates_are_refused() -> None:
    with pytest.raises(ValueError, match="built in"):
        registry.register_estimator("grpo")
    with pytest.raises(ValueError, match="built in"):
        registry.register_policy_loss("ppo")
    name = _unique("dup")
    registry.register_policy_loss(name)(lambda *a: None)
    with pytest.raises(ValueError, match="already registered"):
        registry.register_policy_loss(name)


def test_unknown_name_lists_builtin_and_registered_names() -> None:
    name = _unique("listed")
    registry.register_estimator(name)(lambda x, p: None)
    with pytest.raises(KeyError) as info:
        registry.get_estimator("no_such_estimator")
    text = str(info.value)
    assert "'grpo'" in text and name in text and "custom_module" in text


def test_registered_estimator_through_compute_advantages() -> None:
    name = _unique("plus_one")

    @registry.register_estimator(name)
    def plus_one(inputs: AdvantageInputs, params: AdvantageParams) -> AdvantageOutput:
        a = torch.where(inputs.response_mask != 0, inputs.token_level_rewards + 1.0, 0.0)
        return AdvantageOutput(a, a, {})

    rewards = torch.tensor([[0.5, 2.0, 7.0]])
    mask = torch.tensor([[1, 1, 0]])
    out = compute_advantages(name, AdvantageInputs(rewards, mask))
    torch.testing.assert_close(out.advantages, torch.tensor([[1.5, 3.0, 0.0]]))
    assert not out.advantages.requires_grad

    bad = _unique("bad_shape")
    registry.register_estimator(bad)(lambda x, p: AdvantageOutput(torch.zeros(3), torch.zeros(3), {}))
    with pytest.raises(ValueError, match="must be"):
        compute_advantages(bad, AdvantageInputs(rewards, mask))


def test_registered_policy_loss_is_aggregated_like_a_builtin() -> None:
    name = _unique("neg_adv_logp")

    @registry.register_policy_loss(name)
    def loss(
        logp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, clip: object
    ) -> TokenLosses:
        return TokenLosses(-adv * logp * 2.0)

    logp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, 2.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = compute_policy_loss(
        name, logp, logp.detach(), adv, mask, agg_mode=LossAggMode.TOKEN_SUM, clip=ClipParams()
    )
    # token-sum of -2 A logp over the three valid tokens: 2 + 4 - 1 = 5
    assert float(out.loss.detach()) == pytest.approx(5.0)
    out.loss.backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([[-2.0, -2.0], [2.0, 0.0]]))


def test_config_checks_names_after_importing_the_module(tmp_path: Path) -> None:
    est, pl = _unique("file_est"), _unique("file_loss")
    module = tmp_path / "algo.py"
    module.write_text(
        "from quartet.core.registry import register_estimator, register_policy_loss\n"
        f"register_estimator({est!r}, needs_group=True)(lambda inputs, params: None)\n"
        f"register_policy_loss({pl!r})(lambda *args: None)\n"
    )
    cfg = load_config(
        overrides=[
            f"algorithm.custom_module={module}",
            f"algorithm.adv_estimator={est}",
            f"actor.policy_loss={pl}",
        ]
    )
    assert cfg.algorithm.adv_estimator == est and cfg.actor.policy_loss == pl
    assert cfg.algorithm.needs_group and not cfg.algorithm.needs_critic
    assert str(module) in os.environ[registry.CUSTOM_MODULES_ENV].split(os.pathsep)  # for child processes
    with pytest.raises(ConfigError) as info:  # a group estimator with groups of one
        load_config(
            overrides=[f"algorithm.custom_module={module}", f"algorithm.adv_estimator={est}", "rollout.n=1"]
        )
    assert "rollout.n=1 gives groups of one" in str(info.value)  # among the problems reported together
    with pytest.raises(ConfigError) as bad_loss:
        load_config(overrides=[f"algorithm.custom_module={module}", f"actor.policy_loss={pl}x"])
    assert bad_loss.value.field == "actor.policy_loss"
    assert f"did you mean '{pl}'" in bad_loss.value.fix and "'ppo'" in bad_loss.value.fix


def test_config_errors_name_the_module_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as missing:
        load_config(overrides=[f"algorithm.custom_module={tmp_path / 'nope.py'}"])
    assert missing.value.field == "algorithm.custom_module" and "no such file" in str(missing.value)
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError) as failed:
        load_config(overrides=[f"algorithm.custom_module={broken}"])
    assert "RuntimeError: boom" in str(failed.value)
    with pytest.raises(ConfigError) as unknown:
        load_config(overrides=["algorithm.adv_estimator=grpp"])
    assert "did you mean 'grpo'" in unknown.value.fix


def test_a_module_is_imported_once(tmp_path: Path) -> None:
    counter = tmp_path / "count.py"
    counter.write_text("import builtins\nbuiltins.__dict__.setdefault('_quartet_count', []).append(1)\n")
    import builtins

    before = len(builtins.__dict__.get("_quartet_count", []))
    first = registry.import_custom_module(str(counter))
    assert registry.import_custom_module(str(counter)) is first
    assert len(builtins.__dict__["_quartet_count"]) == before + 1
    assert registry.import_custom_module("") is None
