"""`quartet config show [--config FILE] [--doc] [key=value ...]`: print the resolved config as YAML."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quartet.config import ConfigError, QuartetConfig, iter_field_docs, load_config, to_dict, to_yaml


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("config", help="inspect configuration")
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="print the resolved config (defaults < file < overrides) as YAML")
    show.add_argument("--config", "-c", help="YAML config file")
    show.add_argument("--doc", action="store_true", help="print each field's documentation instead")
    show.add_argument("--no-validate", action="store_true", help="skip the cross-field checks")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-5 rollout.n=4")
    show.set_defaults(run=run_show)


def run_show(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config, args.overrides, check=not args.no_validate)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if args.doc:
        values = _flatten(cfg)
        for path, doc in iter_field_docs(QuartetConfig):
            if path in values:
                print(f"{path} = {values[path]}\n    {doc}")
        return 0
    print(to_yaml(cfg), end="")
    return 0


def _flatten(cfg: QuartetConfig) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(value, path)
            else:
                out[path] = value

    walk(to_dict(cfg), "")
    return out
