"""verl's tools and interaction files, loaded as they are: verl's keys and class paths mapped to quartet's.

A verl tools file and a verl interaction file (what `actor_rollout_ref.rollout.multi_turn.tool_config_path`
and `interaction_config_path` name in a verl recipe) look like

    tools:                                              interaction:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool       - name: gsm8k
        config: {type: native}                              class_name: verl.interactions.gsm8k_...
        tool_schema: {type: function, function: {...}}      config: {}

An entry with `class_name` is read as verl's (`quartet.agents.yaml_registry` calls `verl_tool_entry` or
`verl_interaction_entry`): `class_name` -> `class`, `tool_schema` -> `schema`; a tool's `config.type`
(`native`: an in-process tool, quartet's only kind) is dropped, `mcp` is refused. A class under `verl.` is
replaced by quartet's equivalent (`VERL_TOOLS`, `VERL_INTERACTIONS`); one without an equivalent is an error
naming the class and quartet's own tools or interactions. verl itself is never imported. A class of your
own keeps its path: it must then be a quartet `Tool` or `Interaction` subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "QUARTET_INTERACTIONS",
    "QUARTET_TOOLS",
    "VERL_INTERACTIONS",
    "VERL_TOOLS",
    "verl_interaction_entry",
    "verl_tool_entry",
]

GSM8K_TOOL = "quartet.agents.tools.gsm8k:Gsm8kAnswerTool"
GSM8K_INTERACTION = "quartet.agents.interactions.gsm8k:Gsm8kInteraction"
VERL_TOOLS: dict[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": GSM8K_TOOL,
    "verl.workers.tool.gsm8k_tool.Gsm8kTool": GSM8K_TOOL,  # the path of verl releases before 0.4
}
"""verl tool classes and the quartet tool that does the same."""
VERL_INTERACTIONS: dict[str, str] = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": GSM8K_INTERACTION,
}
"""verl interaction classes and the quartet interaction that does the same."""
QUARTET_TOOLS = (
    "quartet.agents.tools.calculator:CalculatorTool",
    "quartet.agents.tools.python_runner:PythonTool",
    GSM8K_TOOL,
)
"""quartet's own tools, named when a verl tool has no equivalent."""
QUARTET_INTERACTIONS = (
    "quartet.agents.interactions.guessing:GuessingGameInteraction",
    GSM8K_INTERACTION,
)
"""quartet's own interactions, named when a verl interaction has no equivalent."""

_TOOL_KEYS = {"class_name": "class", "config": "config", "tool_schema": "schema"}
_INTERACTION_KEYS = {"class_name": "class", "name": "name", "config": "config"}


def _renamed(entry: Mapping[str, Any], keys: Mapping[str, str]) -> dict[str, Any]:
    """The entry with verl's keys renamed to quartet's; ValueError("<key>: ...") for a key verl has not."""
    out: dict[str, Any] = {}
    for key, value in entry.items():
        if key not in keys:
            raise ValueError(f"{key}: not a key of a verl entry; verl's keys: {', '.join(keys)}")
        out[keys[key]] = value
    return out


def _mapped_class(path: object, table: Mapping[str, str], ours: tuple[str, ...], kind: str) -> object:
    """quartet's class for a `verl.` class path; other paths unchanged."""
    if not isinstance(path, str) or not path.strip().startswith("verl."):
        return path
    path = path.strip()
    if path in table:
        return table[path]
    known = ", ".join(sorted(table))
    raise ValueError(
        f"class_name: the verl {kind} {path!r} has no quartet equivalent (mapped: {known}); use one of "
        f"quartet's {kind}s ({', '.join(ours)}) or a quartet {kind} class of your own"
    )


def verl_tool_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A verl tools-file entry as quartet's (module docstring); ValueError("<field>: problem") if not."""
    out = _renamed(entry, _TOOL_KEYS)
    out["class"] = _mapped_class(out.get("class"), VERL_TOOLS, QUARTET_TOOLS, "tool")
    config = out.get("config")
    if isinstance(config, Mapping) and "type" in config:
        kind = str(config["type"]).lower()
        if kind != "native":
            raise ValueError(
                f"config.type: verl's {kind!r} tools have no quartet equivalent; quartet runs native "
                "(in-process) tools only: use type: native with a quartet tool class"
            )
        out["config"] = {k: v for k, v in config.items() if k != "type"}
    return out


def verl_interaction_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A verl interaction-file entry as quartet's; ValueError("<field>: problem") if not."""
    out = _renamed(entry, _INTERACTION_KEYS)
    out["class"] = _mapped_class(out.get("class"), VERL_INTERACTIONS, QUARTET_INTERACTIONS, "interaction")
    return out
