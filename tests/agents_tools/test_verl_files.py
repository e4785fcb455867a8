"""verl's tools and interaction files load unchanged (`quartet.agents.verl_compat`), and what they build
behaves as verl's GSM8K tool and interaction: the answer checked against the ground truth, the tool's
penalty for a call that does not improve the score, the interaction asking again until the answer is right.

The two YAML files under `verl_files/` are written in verl's layout (`class_name`, `config: {type:
native}`, `tool_schema`; a top-level `interaction:`), as a verl recipe names them.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest

from quartet.agents.interaction_registry import InteractionConfigError, build_interactions, load_interactions
from quartet.agents.interactions.gsm8k import RETRY, Gsm8kInteraction
from quartet.agents.tools.gsm8k import Gsm8kAnswerTool, gsm8k_score, last_number
from quartet.agents.tools.registry import ToolConfigError, build_tools, load_tools
from quartet.agents.verl_compat import QUARTET_INTERACTIONS, QUARTET_TOOLS

FILES = Path(__file__).parent / "verl_files"


def test_verl_tool_file_loads_unchanged_as_the_gsm8k_answer_tool() -> None:
    tools = load_tools(FILES / "gsm8k_tool_config.yaml")
    tool = tools["calc_gsm8k_reward"]
    assert list(tools) == ["calc_gsm8k_reward"] and isinstance(tool, Gsm8kAnswerTool)
    assert tool.parameters["required"] == ["answer"]
    assert tool.description.startswith("Checks your final answer")  # the file's schema, not the default


def test_the_tool_scores_like_verls_and_charges_a_call_that_does_not_improve() -> None:
    tool = load_tools(FILES / "gsm8k_tool_config.yaml")["calc_gsm8k_reward"]

    async def play() -> list[tuple[float | None, float]]:
        iid = await tool.create(ground_truth="1,250")
        out = []
        for answer in ("12", "so it is 1250.", "1250", "#### 7"):
            call = await tool.execute(iid, {"answer": answer})
            out.append((call.reward, await tool.calc_reward(iid)))
        return out

    wrong, right, again, worse = asyncio.run(play())
    assert wrong == (-0.05, 0.0)  # no improvement over the start (0)
    assert right == (0.0, 1.0)  # improved
    assert again == (-0.05, 1.0)  # the same score again
    assert worse == (-0.05, 0.0)  # the trajectory's outcome is the last answer's score
    with pytest.raises(ValueError, match="create_kwargs.ground_truth"):
        asyncio.run(tool.create())


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("The answer is 42.", "42"),
        ("-3 apples", "-3"),
        ("$1,234.5", "1234.5"),
        ("no digits", None),
        (". ,", None),
    ],
)
def test_the_answer_is_the_last_number(text: str, number: str | None) -> None:
    assert last_number(text) == number
    assert gsm8k_score(text, number) == (1.0 if number is not None else 0.0)


def test_verl_interaction_file_loads_unchanged_and_asks_until_right() -> None:
    interactions = load_interactions(FILES / "gsm8k_interaction_config.yaml")
    gsm8k = interactions["gsm8k"]
    assert isinstance(gsm8k, Gsm8kInteraction)

    async def play() -> list[Any]:
        iid = await gsm8k.start(ground_truth="18")
        first = await gsm8k.respond(
            iid, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "17"}]
        )
        said = [{"role": "assistant", "content": "I get 9 + 9 = 18"}, {"role": "user", "content": "thanks"}]
        second = await gsm8k.respond(iid, said)  # the last ASSISTANT turn is read
        return [first, second]

    first, second = asyncio.run(play())
    assert (first.done, first.score, first.content) == (False, 0.0, RETRY)
    assert (second.done, second.score) == (True, 1.0)


def _tool_entry(**changes: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"class_name": "verl.tools.gsm8k_tool.Gsm8kTool", "config": {"type": "native"}}
    return {**entry, **changes}


def test_a_verl_class_without_an_equivalent_names_it_and_quartets_tools() -> None:
    entry = _tool_entry(class_name="verl.tools.search_tool.SearchTool")
    with pytest.raises(ToolConfigError) as caught:
        build_tools({"tools": [entry]}, "search.yaml")
    text = str(caught.value)
    assert text.startswith(
        "search.yaml: tools[0].class_name: the verl tool 'verl.tools.search_tool.SearchTool'"
    )
    assert all(path in text for path in QUARTET_TOOLS)
    with pytest.raises(
        InteractionConfigError, match="verl.interactions.weather_interaction.WeatherInteraction"
    ) as i:
        build_interactions(
            {
                "interaction": [
                    {"name": "w", "class_name": "verl.interactions.weather_interaction.WeatherInteraction"}
                ]
            }
        )
    assert all(path in str(i.value) for path in QUARTET_INTERACTIONS)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (_tool_entry(config={"type": "mcp"}), "tools[0].config.type: verl's 'mcp' tools have no quartet"),
        (_tool_entry(tool_schma={}), "tools[0].tool_schma: not a key of a verl entry"),
        (_tool_entry(config={"type": "native", "nope": 1}), "Gsm8kAnswerTool has no option 'nope'"),
    ],
)
def test_verl_entry_mistakes_are_named(entry: dict[str, Any], says: str) -> None:
    with pytest.raises(ToolConfigError, match=re.escape(says)):
        build_tools({"tools": [entry]})


def test_the_fix_names_quartets_registry_and_the_porting_page() -> None:
    import importlib

    from quartet.agents.interaction import Interaction
    from quartet.agents.tools.base import Tool
    from quartet.agents.verl_compat import BUILTIN_INTERACTION_CLASSES, BUILTIN_TOOL_CLASSES, porting_fix
    from quartet.config.rollout import BUILTIN_INTERACTIONS, BUILTIN_TOOLS

    # the names the fix offers are the ones rollout.multi_turn.tools / .interactions accept
    assert tuple(BUILTIN_TOOL_CLASSES) == BUILTIN_TOOLS
    assert tuple(BUILTIN_INTERACTION_CLASSES) == BUILTIN_INTERACTIONS
    for paths, base in ((QUARTET_TOOLS, Tool), (QUARTET_INTERACTIONS, Interaction)):
        for path in paths:
            module, name = path.split(":")
            assert issubclass(getattr(importlib.import_module(module), name), base), path
    doc = (Path(__file__).parents[2] / "docs" / "multi_turn.md").read_text()
    for kind, section, base in (("tool", "Tools", Tool), ("interaction", "Simulated users", Interaction)):
        fix = porting_fix(kind, "verl.x.y.Thing")
        assert f"## {section}\n" in doc and f'docs/multi_turn.md, "{section}"' in fix
        assert f"subclass of {base.__module__}.{base.__name__}" in fix
        assert "class_name: my_pkg.my_module:Thing" in fix


def test_an_unknown_verl_interaction_carries_its_fix_apart(tmp_path: Path) -> None:
    path = tmp_path / "weather.yaml"
    weather = "verl.interactions.weather_interaction.WeatherInteraction"
    path.write_text(f"interaction:\n  - name: w\n    class_name: {weather}\n")
    with pytest.raises(InteractionConfigError) as caught:
        load_interactions(path)
    cause = caught.value.__cause__
    assert cause is not None and str(caught.value).endswith(f"; {cause.fix}")  # type: ignore[attr-defined]
    assert "port WeatherInteraction as a subclass of quartet.agents.interaction.Interaction" in cause.fix  # type: ignore[attr-defined]
