"""Tools for multi-turn agentic RL: the interface, YAML declaration, call parsing, safe execution, built-ins.

    tools = load_tools("tools.yaml")                     # {name: Tool}, checked at start-up
    parsed = get_parser("hermes").parse(model_text)       # ParsedTurn(content, calls, errors)
    results, metrics = await run_tool_calls(parsed.calls, tools, instance_ids, timeout_s=10,
                                            max_response_chars=512)

Built-in tools: `calculator.CalculatorTool` (exact arithmetic over `ast`), `python_runner.PythonTool`
(a program in a limited child process) and `zoom.ZoomTool` (a crop of the prompt's image, enlarged: a tool
that returns an image). Importing this package imports neither Ray nor transformers.
"""

from quartet.agents.tools.base import Tool, ToolResult, ToolSchemaError, check_schema
from quartet.agents.tools.executor import run_tool_calls, truncate
from quartet.agents.tools.parsing import (
    PARSERS,
    HermesParser,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    get_parser,
)
from quartet.agents.tools.registry import ToolConfigError, build_tools, load_tools

__all__ = [
    "PARSERS",
    "HermesParser",
    "ParsedTurn",
    "Tool",
    "ToolCall",
    "ToolCallParser",
    "ToolConfigError",
    "ToolResult",
    "ToolSchemaError",
    "build_tools",
    "check_schema",
    "get_parser",
    "load_tools",
    "run_tool_calls",
    "truncate",
]
