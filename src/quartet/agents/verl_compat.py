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
replaced by quartet's equivalent (`VERL_TOOLS`, `VERL_INTERACTIONS`); one without an equivalent is a
`VerlClassError` naming the class, quartet's own tools or interactions (by their built-in names and class
paths) and how to port it: a `Tool` or `Interaction` subclass of your own, named by its path in the same
entry (docs/multi_turn.md). verl itself is never imported. A class of your own keeps its path: it must then
be a quartet `Tool` or `Interaction` subclass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BUILTIN_INTERACTION_CLASSES",
    "BUILTIN_TOOL_CLASSES",
    "QUARTET_INTERACTIONS",
    "QUARTET_TOOLS",
    "VERL_INTERACTIONS",
    "VERL_TOOLS",
    "VerlClassError",
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
BUILTIN_TOOL_CLASSES: dict[str, str] = {
    "calculator": "quartet.agents.tools.calculator:CalculatorTool",
    "python": "quartet.agents.tools.python_runner:PythonTool",
    "zoom": "quartet.agents.tools.zoom:ZoomTool",
}
"""The tools `rollout.multi_turn.tools` names (`quartet.config.rollout.BUILTIN_TOOLS`) and their classes."""
BUILTIN_INTERACTION_CLASSES: dict[str, str] = {
    "guessing_game": "quartet.agents.interactions.guessing:GuessingGameInteraction",
}
"""The interactions `rollout.multi_turn.interactions` names and their classes."""
QUARTET_TOOLS = (*BUILTIN_TOOL_CLASSES.values(), GSM8K_TOOL)
"""quartet's own tool classes, named when a verl tool has no equivalent."""
QUARTET_INTERACTIONS = (*BUILTIN_INTERACTION_CLASSES.values(), GSM8K_INTERACTION)
"""quartet's own interaction classes, named when a verl interaction has no equivalent."""
_PORTING = {
    "tool": (
        BUILTIN_TOOL_CLASSES,
        QUARTET_TOOLS,
        "rollout.multi_turn.tools",
        "quartet.agents.tools.base.Tool (async create / execute / calc_reward / release, the shape of "
        "verl's BaseTool)",
        'docs/multi_turn.md, "Tools"',
    ),
    "interaction": (
        BUILTIN_INTERACTION_CLASSES,
        QUARTET_INTERACTIONS,
        "rollout.multi_turn.interactions",
        "quartet.agents.interaction.Interaction (async start / respond / finish, the shape of verl's "
        "BaseInteraction)",
        'docs/multi_turn.md, "Simulated users"',
    ),
}


class VerlClassError(ValueError):
    """A verl class with no quartet equivalent: `field: problem; fix`, the parts kept for callers that
    print the fix on its own line (`quartet config from-verl`)."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field}: {problem}; {fix}")


def porting_fix(kind: str, path: str) -> str:
    """How to replace the verl `kind` class `path`: quartet's own (built-in names and class paths), or a
    subclass of quartet's base class named by its path in the same entry, and the doc page."""
    builtin, classes, key, base, doc = _PORTING[kind]
    short = path.rsplit(".", 1)[-1]
    names = ", ".join(builtin)
    return (
        f"use one of quartet's {kind}s, by name in {key} ({names}) or by class in this file "
        f"(class_name: {' | '.join(classes)}), or port {short} as a subclass of {base} in a module of "
        f"yours and name it in this entry (class_name: my_pkg.my_module:{short}); see {doc}"
    )


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


def _mapped_class(path: object, table: Mapping[str, str], kind: str) -> object:
    """quartet's class for a `verl.` class path; other paths unchanged."""
    if not isinstance(path, str) or not path.strip().startswith("verl."):
        return path
    path = path.strip()
    if path in table:
        return table[path]
    known = ", ".join(sorted(table))
    problem = f"the verl {kind} {path!r} has no quartet equivalent (quartet maps {known} only)"
    raise VerlClassError("class_name", problem, porting_fix(kind, path))


def verl_tool_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A verl tools-file entry as quartet's (module docstring); ValueError("<field>: problem") if not."""
    out = _renamed(entry, _TOOL_KEYS)
    out["class"] = _mapped_class(out.get("class"), VERL_TOOLS, "tool")
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
    out["class"] = _mapped_class(out.get("class"), VERL_INTERACTIONS, "interaction")
    return out
