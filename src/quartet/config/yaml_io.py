"""YAML reading and writing with YAML 1.2 scalars.

PyYAML implements YAML 1.1, where `off`, `no` and `y` are booleans and `1e-5` is a string. Config users
write `trainer.resume=off` and `actor.optim.lr=1e-5`, so the loader below resolves booleans only from
true/false and floats in every spelling Python's float() accepts.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["dump_yaml", "load_yaml", "parse_scalar"]


class _Loader(yaml.SafeLoader):
    pass


# Drop the YAML 1.1 bool and float resolvers, then add YAML 1.2 ones.
_Loader.yaml_implicit_resolvers = {
    ch: [
        (tag, rx) for tag, rx in resolvers if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:float")
    ]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML text with YAML 1.2 booleans and floats."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


def parse_scalar(text: str) -> Any:
    """Parse the value side of a CLI override (`[a, b]` is a list, `null` is None, `1e-5` a float)."""
    return load_yaml(text) if text.strip() else ""


def dump_yaml(data: Any) -> str:
    """Block-style YAML that `load_yaml` reads back to the same data."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True)
