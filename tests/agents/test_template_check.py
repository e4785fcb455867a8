"""The chat-template check on templates written to reproduce the popular families (template_cases.py),
each saved with the tiny tokenizer and loaded through `AutoTokenizer.from_pretrained`; its CLI; and the
run-start policy of `rollout.multi_turn.template_mode=strict`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from template_cases import TEMPLATES, save_with_template
from transformers import AutoTokenizer

from quartet.agents.runner import AgentRunner
from quartet.agents.template_check import BreakRule, TemplateVerdict, check_model_dir
from quartet.agents.template_policy import TemplateBreakError
from quartet.cli.main import main
from quartet.config.rollout import MultiTurnConfig, TemplateMode
from quartet.core.batch import Batch
from quartet.rollout.types import SamplingParams


@pytest.fixture(scope="module")
def folders(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("templates")
    return {name: save_with_template(tiny_model_dir, t, root / name) for name, t in TEMPLATES.items()}


@pytest.fixture(scope="module")
def verdicts(folders: dict[str, Path]) -> dict[str, TemplateVerdict]:
    return {name: check_model_dir(folder) for name, folder in folders.items()}


def _broken_probes(verdict: TemplateVerdict) -> set[str]:
    return {t.probe for t in verdict.turns if not t.extends}


def test_qwen3_like_drops_reasoning_at_user_turns_only(verdicts: dict[str, TemplateVerdict]) -> None:
    v = verdicts["qwen3_like"]
    assert not v.prefix_safe and v.rules() == [BreakRule.REASONING_DROPPED]
    # Qwen3's rule: reasoning survives inside one user query's tool loop, goes once the user speaks again
    chats = {"think_user_turns", "reasoning_content_user_turns"}
    assert _broken_probes(v) == chats | {f"{name}+system" for name in chats}
    assert all(t.extends for t in v.turns if t.probe.startswith("think_tool_call"))
    first = v.first_break()
    assert first is not None
    turn, brk = first
    assert turn.probe == "think_user_turns" and turn.turn == 1
    after_kept, after_rendered = brk.expected.split(" >>> ")[1], brk.rendered.split(" >>> ")[1]
    assert after_kept.startswith("<think>") and after_rendered.startswith("My guess is 4.")


def test_default_system_prompt_breaks_the_delta_rendered_alone(verdicts: dict[str, TemplateVerdict]) -> None:
    v = verdicts["default_system"]
    # the whole conversation re-renders with the same default system prompt each time: the prefix holds
    assert v.prefix_safe and not v.delta_alone_safe and not v.ok
    assert v.rules() == [BreakRule.DEFAULT_SYSTEM_PROMPT]
    first = v.first_break()
    assert first is not None and first[1].rule is BreakRule.DEFAULT_SYSTEM_PROMPT
    tok = AutoTokenizer.from_pretrained(v.model)
    default = tok.encode(
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", add_special_tokens=False
    )
    assert f"drop their first {len(default)} tokens" in first[1].detail


def test_sorted_json_template_rerenders_structured_tool_calls(verdicts: dict[str, TemplateVerdict]) -> None:
    v = verdicts["sorted_tool_json"]
    assert not v.prefix_safe and v.rules() == [BreakRule.TOOL_CALL_RERENDERED]
    # only where history holds the call as structured tool_calls; quartet's loop keeps the text
    assert all("structured" in name for name in _broken_probes(v))
    assert all(t.extends for t in v.turns if "text" in t.probe)
    first = v.first_break()
    assert first is not None
    assert '<tool_call>\n{"name": "calc' in first[1].expected.replace(" >>> ", "")
    assert '<tool_call>\n{"arguments":{"digits":2' in first[1].rendered.replace(" >>> ", "")


def test_well_behaved_and_shipped_templates_pass(
    verdicts: dict[str, TemplateVerdict], tiny_model_dir: Path
) -> None:
    v = verdicts["well_behaved"]
    assert v.ok and v.first_break() is None and v.rules() == []
    # its reasoning_content probe ran (the template reads the field) and kept the prefix
    assert any(t.probe.startswith("reasoning_content") for t in v.turns)
    shipped = check_model_dir(tiny_model_dir)
    assert shipped.ok and len(shipped.turns) > 10


def test_cli_exit_codes_strings_and_json(
    folders: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "template", str(folders["well_behaved"])]) == 0
    assert "prefix-safe" in capsys.readouterr().out
    assert main(["check", "template", str(folders["qwen3_like"])]) == 1
    out = capsys.readouterr().out
    assert "reasoning_dropped" in out and "think_user_turns" in out and "<think>" in out
    assert main(["check", "template", str(folders["sorted_tool_json"]), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["prefix_safe"] is False and report["rules"] == ["tool_call_rerendered"]
    assert main(["check", "template", str(folders["default_system"]), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["rules"] == ["default_system_prompt"]


def test_cli_names_a_folder_without_a_chat_template(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = save_with_template(tiny_model_dir, "", tmp_path / "plain")
    assert main(["check", "template", str(folder)]) == 1
    assert "no chat template" in capsys.readouterr().err
    assert main(["check", "template", str(tmp_path / "missing")]) == 1
    assert "is not a folder" in capsys.readouterr().err


def _runner(folder: Path, mode: TemplateMode) -> AgentRunner:
    mt = MultiTurnConfig(
        enable=True, tools=("calculator",), interactions=("guessing_game",), template_mode=mode
    )
    return AgentRunner.from_config(mt, AutoTokenizer.from_pretrained(folder), max_response_tokens=96)


def _prompts() -> Batch:
    rows = [[{"role": "user", "content": "Guess my number."}]] * 2
    return Batch({}, {"raw_prompt": rows, "agent_name": ["user_sim"] * 2}, batch_size=2)


def test_strict_refuses_a_breaking_template_before_any_generation(folders: dict[str, Path]) -> None:
    runner = _runner(folders["qwen3_like"], TemplateMode.STRICT)
    calls: list[Any] = []

    async def generate(prompt_ids: Any, params: SamplingParams) -> Any:
        calls.append(prompt_ids)
        raise AssertionError("strict must refuse before generating")

    with pytest.raises(TemplateBreakError) as err:
        runner.run(_prompts(), SamplingParams(max_new_tokens=8), generate, pad_token_id=0)
    text = str(err.value)
    assert str(folders["qwen3_like"]) in text and "after model turn" in text
    assert "reasoning_dropped" in text and "template_mode=keep_history_tokens" in text and "rerender" in text
    assert not calls


@pytest.mark.parametrize("mode", [TemplateMode.KEEP_HISTORY_TOKENS, TemplateMode.RERENDER])
def test_other_modes_accept_the_breaking_template(folders: dict[str, Path], mode: TemplateMode) -> None:
    verdict = _runner(folders["qwen3_like"], mode).preflight([[{"role": "user", "content": "Guess."}]])
    assert not verdict.prefix_safe and verdict.rules() == [BreakRule.REASONING_DROPPED]


def test_strict_accepts_a_well_behaved_template(folders: dict[str, Path]) -> None:
    verdict = _runner(folders["well_behaved"], TemplateMode.STRICT).preflight(
        [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Guess."}]]
    )
    assert verdict.prefix_safe
    # the run's own conversation was probed: its tools, its user turns
    assert {t.probe for t in verdict.turns} == {"row0"} and len(verdict.turns) == 3


def test_the_run_checks_its_first_rows_before_any_worker(folders: dict[str, Path]) -> None:
    """`prepare_run`'s step: the training rows, the run's tools and interactions, the configured mode."""
    from quartet.config import load_config
    from quartet.data.prompts import PromptDataset
    from quartet.trainer.feed.rl_data import RLData
    from quartet.trainer.loop.session import check_chat_template

    keys = ["rollout.multi_turn.enable=true", "rollout.multi_turn.interactions=[guessing_game]"]
    row = {
        "prompt": [{"role": "user", "content": "Guess."}],
        "data_source": "guessing",
        "reward_model": {"ground_truth": "5"},
    }
    for name, mode, refused in [
        ("qwen3_like", "strict", True),
        ("qwen3_like", "keep_history_tokens", False),
        ("well_behaved", "strict", False),
    ]:
        cfg = load_config(overrides=[*keys, f"rollout.multi_turn.template_mode={mode}"])
        tok = AutoTokenizer.from_pretrained(folders[name])
        data = RLData(PromptDataset.from_rows([row] * 4, cfg.data, tok, "rows.jsonl"), None)
        if refused:
            with pytest.raises(TemplateBreakError, match="reasoning_dropped"):
                check_chat_template(cfg, tok, data, str(folders[name]))
        else:
            check_chat_template(cfg, tok, data, str(folders[name]))


def test_cli_help_says_what_the_exit_status_means(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["check", "template", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "exit status" in text and "1  a break" in text and "--json" in text
