"""Agent loops registered by name, as estimators are: the built-ins through the decorator, a user's loop from
`algorithm.custom_module` named by `rollout.multi_turn.default_agent` and run by a rollout replica in a Ray
worker (which imports the module itself), and the errors: an unknown name (with the closest one) and a name
registered twice."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from quartet.agents.loops import (
    register_agent_loop,
    registered_agent_loops,
    single_turn_loop,
    tool_agent_loop,
    user_sim_loop,
)
from quartet.agents.runner import AgentRunner
from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool
from quartet.config import ConfigError, load_config
from quartet.config.rollout import MultiTurnConfig
from quartet.data.prompts import PromptDataset
from quartet.models.loading import load_tokenizer
from quartet.roles.rollout import Rollout
from quartet.tasks.rows import rl_row
from quartet.trainer.workers.start import run_values

USER_LOOP = textwrap.dedent(
    """
    import os

    from quartet.agents.loops import register_agent_loop, single_turn_loop


    @register_agent_loop("marked_single_turn")
    async def marked_single_turn(row, generate, env):
        trajectory = await single_turn_loop(row, generate, env)
        trajectory.metrics["custom/marked"] = 1.0
        trajectory.metrics["custom/pid"] = float(os.getpid())
        return trajectory
    """
)


def test_builtin_loops_are_registered_through_the_decorator() -> None:
    loops = dict(registered_agent_loops())
    assert list(loops)[:3] == ["single_turn", "tool_agent", "user_sim"]
    assert loops["single_turn"] is single_turn_loop
    assert loops["tool_agent"] is tool_agent_loop
    assert loops["user_sim"] is user_sim_loop


def test_a_name_is_registered_once(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"'tool_agent' is already registered \(by quartet\.agents\.loops\)"):
        register_agent_loop("tool_agent")
    with pytest.raises(ValueError, match="non-empty string"):
        register_agent_loop("")
    twice = tmp_path / "twice.py"
    twice.write_text(
        "from quartet.agents.loops import register_agent_loop, single_turn_loop\n"
        'register_agent_loop("twice_loop")(single_turn_loop)\n'
        'register_agent_loop("twice_loop")(single_turn_loop)\n'
    )
    with pytest.raises(
        ConfigError, match=r"(?s)algorithm\.custom_module.*'twice_loop' is already registered"
    ):
        load_config(None, [f"algorithm.custom_module={twice}"])


def test_an_unknown_default_agent_fails_at_start_naming_the_closest(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = load_config(None, ["rollout.multi_turn.enable=true", "rollout.multi_turn.default_agent=tool_agnet"])
    with pytest.raises(ConfigError) as info:
        AgentRunner.from_config(cfg.rollout.multi_turn, tokenizer, 8)
    assert info.value.field == "rollout.multi_turn.default_agent"
    assert "unknown agent loop 'tool_agnet'" in info.value.problem
    assert "did you mean 'tool_agent'?" in info.value.fix
    assert "known loops: single_turn, tool_agent, user_sim" in info.value.fix
    assert "@register_agent_loop" in info.value.fix
    with pytest.raises(ConfigError, match="default_agent: must name an agent loop"):
        MultiTurnConfig(default_agent="")


def _prompts(cfg: Any, model_dir: Path) -> Any:
    rows = [
        rl_row(
            [{"role": "user", "content": f"What is {a} + 1?"}], "calculator", str(a + 1), index=i, split="t"
        )
        for i, a in enumerate((12, 34))
    ]
    data = PromptDataset.from_rows(rows, cfg.data, load_tokenizer(str(model_dir)), "rows")
    return data.batch([0, 1]).with_meta(global_step=1)


@pytest.mark.ray
def test_a_user_loop_from_the_custom_module_runs_in_a_rollout_worker(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    module = tmp_path / "my_loops.py"
    module.write_text(USER_LOOP)
    cfg = load_config(
        None,
        [
            f"algorithm.custom_module={module}",
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.default_agent=marked_single_turn",
            "rollout.n=2",
            "data.max_prompt_length=96",
            "data.max_response_length=8",
        ],
    )
    assert "marked_single_turn" in registered_agent_loops()  # the driver imported the module
    pool = ResourcePool(1, 1, 0.5, use_gpu=False, timeout_s=60).create()
    hosts = colocate(
        pool,
        RunNames("quartet-tests", "user-agent-loop"),
        label="rl",
        rollout=RoleSpec(Rollout, cfg.rollout, run_values(cfg, str(tiny_model_dir))),
    )
    try:
        batch = hosts.groups["rollout"].generate(_prompts(cfg, tiny_model_dir))
    finally:
        hosts.shutdown()
    metrics = list(batch.non_tensors["agent_metrics"])
    assert len(metrics) == 4
    assert all(m["custom/marked"] == 1.0 for m in metrics)  # only the user's loop writes this
    # the loop ran in the rollout worker, which imported the module on its own
    assert {m["custom/pid"] for m in metrics} != {float(os.getpid())}
