"""Tools from YAML: a good file, and mistakes reported with file, entry index, field and fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from quartet.agents.tools.base import ToolSchemaError, check_schema
from quartet.agents.tools.calculator import CalculatorTool
from quartet.agents.tools.python_runner import PythonTool
from quartet.agents.tools.registry import ToolConfigError, build_tools, load_tools

CALC = "quartet.agents.tools.calculator:CalculatorTool"


def _write(tmp_path: Path, entries: list[dict[str, Any]]) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump({"tools": entries}))
    return path


def _schema(name: str, parameters: Any = None) -> dict[str, Any]:
    params = parameters or {"type": "object", "properties": {"expression": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "description": "d", "parameters": params}}


def test_good_file(tmp_path: Path) -> None:
    path = tmp_path / "tools.yaml"
    path.write_text(
        f"""
tools:
  - class: {CALC}
    config: {{max_digits: 50}}
  - class: quartet.agents.tools.calculator.CalculatorTool   # module.Class works too
    schema:
      type: function
      function:
        name: exact_math
        description: another calculator
        parameters: {{type: object, properties: {{expression: {{type: string}}}}, required: [expression]}}
  - class: quartet.agents.tools.python_runner:PythonTool
    config: {{timeout_s: 2, memory_mb: 256, allow_unisolated: true}}  # builds where bwrap cannot
"""
    )
    tools = load_tools(path)
    assert list(tools) == ["calculator", "exact_math", "python"]
    calc, other, python = tools["calculator"], tools["exact_math"], tools["python"]
    assert isinstance(calc, CalculatorTool) and calc.limits.max_digits == 50
    assert isinstance(other, CalculatorTool) and other.description == "another calculator"
    assert other.limits.max_digits == 100  # the default
    assert isinstance(python, PythonTool) and python.limits.wall_s == 2 and python.limits.memory_mb == 256
    assert python.limits.allow_unisolated
    assert calc.arguments_error({}) == "'expression' is a required property"


def _error(tmp_path: Path, entries: list[dict[str, Any]]) -> str:
    path = _write(tmp_path, entries)
    with pytest.raises(ToolConfigError) as info:
        load_tools(path)
    message = str(info.value)
    assert message.startswith(f"{path}: tools["), message
    return message


def test_unknown_class(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": CALC}, {"class": "quartet.agents.tools.calculator:Calculater"}])
    assert "tools[1].class" in message
    assert "has no 'Calculater'; did you mean 'CalculatorTool'?" in message


def test_unknown_module(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": "quartet.agents.tools.calc:CalculatorTool"}])
    assert "tools[0].class: cannot import module 'quartet.agents.tools.calc'" in message
    assert "check the module path" in message


def test_not_a_tool(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": "collections:OrderedDict"}])
    assert "tools[0].class: 'collections:OrderedDict' is not a concrete subclass" in message


def test_duplicate_name(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": CALC}, {"class": CALC, "config": {"max_digits": 10}}])
    assert "tools[1].schema.function.name: duplicate tool name 'calculator' (also tools[0])" in message
    assert "give each tool a unique name" in message


@pytest.mark.parametrize(
    ("schema", "field", "problem"),
    [
        ({**_schema("c"), "type": "func"}, "schema.type", "must be 'function'"),
        (_schema("my calc"), "schema.function.name", "1-64 letters"),
        (_schema("c", {"type": "array"}), "schema.function.parameters", "type: object"),
        (
            _schema("c", {"type": "object", "properties": {"x": {"type": "strng"}}}),
            "schema.function.parameters.properties.x.type",
            "invalid JSON schema",
        ),
        (
            {"type": "function", "function": {"name": "c", "paramters": {}}},
            "schema.function.paramters",
            "did you mean 'parameters'?",
        ),
    ],
)
def test_bad_schema(tmp_path: Path, schema: dict[str, Any], field: str, problem: str) -> None:
    message = _error(tmp_path, [{"class": CALC}, {"class": CALC, "schema": schema}])
    assert f"tools[1].{field}: " in message and problem in message and "fix the schema" in message


def test_unknown_option_and_key(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": CALC, "config": {"max_digit": 5}}])
    assert "tools[0].config: CalculatorTool has no option 'max_digit'; did you mean 'max_digits'?" in message
    message = _error(tmp_path, [{"class": CALC, "confg": {}}])
    assert "tools[0].confg: unknown key; did you mean 'config'?" in message


def test_constructor_refusal_names_config(tmp_path: Path) -> None:
    message = _error(tmp_path, [{"class": CALC, "config": {"max_digits": 0}}])
    assert (
        "tools[0].config: CalculatorTool(...) failed: ValueError: max_digits must be in [1, 4000]" in message
    )


def test_document_shape_errors(tmp_path: Path) -> None:
    with pytest.raises(ToolConfigError, match=re.escape("x.yaml: tool: unknown top-level key; did you mean")):
        build_tools({"tool": []}, "x.yaml")
    with pytest.raises(ToolConfigError, match=re.escape("x.yaml: tools[0]: expected a mapping")):
        build_tools({"tools": ["calculator"]}, "x.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools: [\n")
    with pytest.raises(ToolConfigError, match=re.escape(f"{bad}: not valid YAML")):
        load_tools(bad)
    with pytest.raises(ToolConfigError, match="cannot read the tools file"):
        load_tools(tmp_path / "missing.yaml")


def test_check_schema_is_a_copy() -> None:
    schema = _schema("c")
    checked = check_schema(schema)
    checked["function"]["parameters"]["properties"].clear()
    assert schema["function"]["parameters"]["properties"] == {"expression": {"type": "string"}}
    with pytest.raises(ToolSchemaError) as info:
        check_schema({"type": "function"})
    assert info.value.field == "schema.function"
