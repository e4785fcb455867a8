"""Field docstrings of the config dataclasses, read from the source.

Each field is documented by the string literal below it (the attribute-docstring convention IDEs show on
hover). This module reads them back so `quartet config show --doc` can print them and a test can insist
that no field is undocumented.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from functools import cache

__all__ = ["field_docs", "iter_field_docs"]


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each field name of dataclass `cls` to its docstring ('' when it has none)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = inspect.cleandoc(nxt.value.value)
    return {f.name: docs.get(f.name, "") for f in dataclasses.fields(cls)}


def iter_field_docs(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, str]]:
    """Yield (dotted path, docstring) for every field of `cls`, descending into nested sections."""
    hints = typing.get_type_hints(cls)
    for name, doc in field_docs(cls).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, doc
        if dataclasses.is_dataclass(hints[name]):
            yield from iter_field_docs(hints[name], path)
