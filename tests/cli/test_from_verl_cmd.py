"""`quartet config from-verl`, run as a user would: the config on stdout or --out, the report on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from quartet.cli.main import main
from quartet.config import load_config

# verl examples/grpo_trainer/run_qwen2-7b.sh (volcengine/verl @ 3f388066192c), the keys that shape the run.
GRPO = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=1024",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.rollout.n=5",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=1",
    "trainer.save_freq=-1",
    "trainer.total_epochs=15",
]


def test_yaml_on_stdout_and_report_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "from-verl", *GRPO]) == 0
    out, err = capsys.readouterr()
    (tmp_path / "run.yaml").write_text(out)
    cfg = load_config(tmp_path / "run.yaml")
    assert (cfg.rollout.n, cfg.actor.mini_batch_size, cfg.actor.micro_batch_size_per_device) == (5, 256, 40)
    assert (cfg.trainer.save_freq, cfg.cluster.world_size, cfg.model.path) == (0, 8, "Qwen/Qwen2-7B-Instruct")
    assert "unmapped: data.truncation='error':" in err
    assert cfg.model.remove_padding  # verl's use_remove_padding=True: packed micro-batches
    assert "converted: trainer.save_freq=-1 -> trainer.save_freq=0" in err
    assert "unmapped" not in out and "converted" not in out


def test_out_file_and_overrides_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "over.txt"
    assert main(["config", "from-verl", "--format", "overrides", "--out", str(target), *GRPO]) == 0
    assert capsys.readouterr().out == ""
    lines = target.read_text().splitlines()
    assert "rollout.n=5" in lines and "actor.kl_loss_coef=0.001" not in lines
    assert load_config(overrides=lines).actor.use_kl_loss is True


def test_verl_yaml_file_with_overrides_after_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verl = {
        "data": {"train_batch_size": 64, "max_prompt_length": 128, "max_response_length": 128},
        "actor_rollout_ref": {
            "model": {"path": "/models/m"},
            "actor": {"ppo_mini_batch_size": 16, "ppo_micro_batch_size_per_gpu": 2},
            "rollout": {"n": 4},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"n_gpus_per_node": 2},
    }
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(verl))
    assert main(["config", "from-verl", "--file", str(path), "actor_rollout_ref.rollout.n=8"]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["rollout"]["n"] == 8 and tree["data"]["train_batch_size"] == 64
    assert tree["cluster"]["bundles_per_node"] == 2


def test_failing_values_exit_2_naming_the_verl_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "from-verl", *GRPO, "data.train_batch_size=1000"]) == 2
    err = capsys.readouterr().err
    assert "the translated config does not validate" in err
    assert "translated from: actor_rollout_ref.actor.ppo_mini_batch_size=256" in err


def test_typo_is_named_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "from-verl", *GRPO, "actor_rollout_ref.rollout.tensor_model_paralel_size=2"]) == 0
    err = capsys.readouterr().err
    assert "did you mean 'actor_rollout_ref.rollout.tensor_model_parallel_size'" in err


def test_nothing_to_translate_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "from-verl"]) == 2
    assert "give verl overrides or --file" in capsys.readouterr().err


def test_unreadable_verl_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "verl.yaml"
    bad.write_text("data: [1\n")
    assert main(["config", "from-verl", "--file", str(bad)]) == 2
    assert "is not valid YAML" in capsys.readouterr().err
    assert main(["config", "from-verl", "--file", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml" in capsys.readouterr().err


VERL_FILES = Path(__file__).parents[1] / "agents_tools" / "verl_files"
MT = "actor_rollout_ref.rollout.multi_turn"


def test_verls_tool_and_interaction_files_pass_the_file_check(capsys: pytest.CaptureFixture[str]) -> None:
    files = [
        f"{MT}.tool_config_path={VERL_FILES / 'gsm8k_tool_config.yaml'}",
        f"{MT}.interaction_config_path={VERL_FILES / 'gsm8k_interaction_config.yaml'}",
    ]
    assert main(["config", "from-verl", *GRPO, *files]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["rollout"]["multi_turn"]["tool_config_path"] == str(VERL_FILES / "gsm8k_tool_config.yaml")


def test_a_missing_or_broken_file_is_named_with_its_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "tool_config" / "gsm8k_tool_config.yaml"
    assert main(["config", "from-verl", *GRPO, f"{MT}.tool_config_path={missing}"]) == 2
    err = capsys.readouterr().err
    assert f"- rollout.multi_turn.tool_config_path: {missing}: no such file" in err
    assert f"translated from: {MT}.tool_config_path={missing}" in err
    broken = tmp_path / "interactions.yaml"
    broken.write_text("interaction:\n  - name: g\n    class_name: verl.interactions.x.Unknown\n")
    data = tmp_path / "train.parquet"
    argv = [f"{MT}.interaction_config_path={broken}", f"data.train_files={data}"]
    assert main(["config", "from-verl", *GRPO, *argv]) == 2
    err = capsys.readouterr().err
    assert (
        f"rollout.multi_turn.interaction_config_path: {broken}: does not load: {broken}: interactions[0]"
        in err
    )
    assert "the verl interaction 'verl.interactions.x.Unknown' has no quartet equivalent" in err
    assert f"- data.train_files: {data}: no such file" in err  # every file problem, not only the first
    assert main(["config", "from-verl", "--no-validate", *GRPO, *argv]) == 0  # the user's choice


def test_notes_are_printed_only_where_a_mapping_changed_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "from-verl", *GRPO, "trainer.test_freq=5"]) == 0
    err = capsys.readouterr().err
    assert "trainer.test_freq" not in err  # copied: nothing to say (was "5 -> 5 (-1 (never) -> 0 (never))")
    assert "converted: trainer.save_freq=-1 -> trainer.save_freq=0" in err  # applied
    assert "converted: trainer.n_gpus_per_node=8 -> cluster.bundles_per_node=8 (GPUs per node" in err
    assert main(["config", "from-verl", *GRPO, "trainer.test_freq=-1"]) == 0
    err = capsys.readouterr().err
    assert "converted: trainer.test_freq=-1 -> trainer.test_freq=0 (-1 (never) -> 0 (never))" in err
    assert main(["config", "from-verl", *GRPO]) == 0  # unset: verl's default -1, converted
    err = capsys.readouterr().err
    default = "converted: verl default trainer.test_freq=-1 -> trainer.test_freq=0"
    assert f"{default} (-1 (never) -> 0 (never))" in err
    assert main(["config", "from-verl", *GRPO, "actor_rollout_ref.rollout.name=vllm"]) == 0
    err = capsys.readouterr().err
    assert "rollout.name" not in err and "rollout.engine" not in err  # vllm -> vllm: copied


SEARCH_TOOL = """\
tools:
  - class_name: {cls}
    config: {{type: native, retrieval_service_url: "http://127.0.0.1:8000/retrieve"}}
    tool_schema:
      type: function
      function:
        name: search
        description: search the web
        parameters: {{type: object, properties: {{query: {{type: string}}}}, required: [query]}}
"""

PORTED_TOOL = """\
from quartet.agents.tools.base import Tool, ToolResult


class SearchTool(Tool):
    def __init__(self, *, retrieval_service_url, schema=None):
        super().__init__(schema=schema)
        self.url = retrieval_service_url

    async def execute(self, instance_id, arguments):
        return ToolResult(text="no results for " + arguments["query"])
"""


def test_an_unknown_verl_tool_class_is_answered_with_quartets_tools_and_how_to_port_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from quartet.agents.verl_compat import BUILTIN_TOOL_CLASSES, QUARTET_TOOLS

    tools = tmp_path / "search_tool_config.yaml"
    tools.write_text(SEARCH_TOOL.format(cls="verl.tools.search_tool.SearchTool"))
    assert main(["config", "from-verl", *GRPO, f"{MT}.tool_config_path={tools}"]) == 2
    err = capsys.readouterr().err
    key = "- rollout.multi_turn.tool_config_path"
    problem = next(line for line in err.splitlines() if line.startswith(key))
    fix = err.split(problem, 1)[1].splitlines()[1]
    # the problem: the file, the entry and the class
    assert f"{tools}: tools[0].class_name: the verl tool 'verl.tools.search_tool.SearchTool'" in problem
    # the fix: quartet's tools by their built-in names and classes, how to port it, and where it is documented
    assert fix.startswith("  fix: use one of quartet's tools")
    assert all(name in fix for name in BUILTIN_TOOL_CLASSES) and all(path in fix for path in QUARTET_TOOLS)
    assert "subclass of quartet.agents.tools.base.Tool" in fix
    assert "class_name: my_pkg.my_module:SearchTool" in fix and 'docs/multi_turn.md, "Tools"' in fix
    assert "give the path" not in err and fix not in problem
    # following the fix: the tool ported as a quartet Tool subclass and named in the same entry loads
    (tmp_path / "my_search_v50.py").write_text(PORTED_TOOL)
    monkeypatch.syspath_prepend(str(tmp_path))
    tools.write_text(SEARCH_TOOL.format(cls="my_search_v50:SearchTool"))
    assert main(["config", "from-verl", *GRPO, f"{MT}.tool_config_path={tools}"]) == 0
    assert "tool_config_path" not in capsys.readouterr().err
