"""`quartet config show [--config FILE] [--doc] [key=value ...]`: print the resolved config as YAML.

`quartet config from-verl [OVERRIDES...] [--file verl.yaml] [--out FILE]`: translate a verl command line
or config into a quartet config (YAML or overrides on stdout or `--out`); unmapped keys and converted
values are listed on stderr. The files the config names (tools and interactions files, data files, a reward
function file) must exist, and the tools and interactions files must load: otherwise the exit status is 2
and the error names the key, the path and the reason.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from quartet.config import ConfigError, QuartetConfig, iter_field_docs, load_config, to_dict, to_yaml
from quartet.config.from_verl import FileLoader, Translation, translate_overrides, translate_tree
from quartet.config.yaml_io import dump_yaml, load_yaml


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("config", help="inspect configuration")
    actions = parser.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="print the resolved config (defaults < file < overrides) as YAML")
    show.add_argument("--config", "-c", help="YAML config file")
    show.add_argument("--doc", action="store_true", help="print each field's documentation instead")
    show.add_argument("--no-validate", action="store_true", help="skip the cross-field checks")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. actor.optim.lr=1e-5 rollout.n=4")
    show.set_defaults(run=run_show)
    verl = actions.add_parser(
        "from-verl", help="translate verl Hydra overrides or a verl YAML config into a quartet config"
    )
    verl.add_argument("overrides", nargs="*", help="verl overrides, e.g. actor_rollout_ref.rollout.n=5")
    verl.add_argument(
        "--file", "-f", help="a verl YAML config (overrides on the command line apply after it)"
    )
    verl.add_argument("--out", "-o", help="write the quartet config here instead of stdout")
    verl.add_argument(
        "--format", choices=["yaml", "overrides"], default="yaml", help="a YAML config or key=value lines"
    )
    verl.add_argument(
        "--quartet-defaults",
        action="store_true",
        help="keys the verl input does not set keep quartet's defaults (default: verl's, where they differ)",
    )
    verl.add_argument("--no-validate", action="store_true", help="skip quartet's cross-field checks")
    verl.set_defaults(run=run_from_verl)


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


def run_from_verl(args: argparse.Namespace) -> int:
    """Translate, report unmapped keys and conversions on stderr, write the config; 2 if it fails checks."""
    try:
        translation = _translate(args)
    except (OSError, ConfigError) as err:
        print(f"from-verl: {err}", file=sys.stderr)
        return 2
    _report(translation)
    status = 0
    try:
        translation.build(check=not args.no_validate, files=None if args.no_validate else _file_loaders())
    except ConfigError as err:
        print(f"from-verl: {err}", file=sys.stderr)
        status = 2
    if args.format == "yaml":
        text = "# Translated from verl by `quartet config from-verl`; unset fields keep quartet's defaults.\n"
        text += dump_yaml(translation.tree())
    else:
        text = "".join(f"{o}\n" for o in translation.overrides())
    if args.out:
        Path(args.out).write_text(text)
        print(f"from-verl: wrote {args.out}", file=sys.stderr)
    else:
        print(text, end="")
    return status


def _file_loaders() -> dict[str, FileLoader | None]:
    """How `from-verl` checks the files the translated config names: the tools and interactions files are
    loaded as a run loads them (verl's layout included); the others must exist."""
    from quartet.agents.interaction_registry import load_interactions
    from quartet.agents.tools.registry import load_tools

    return {
        "rollout.multi_turn.tool_config_path": load_tools,
        "rollout.multi_turn.interaction_config_path": load_interactions,
    }


def _translate(args: argparse.Namespace) -> Translation:
    use_verl_defaults = not args.quartet_defaults
    if not args.file:
        if not args.overrides:
            raise ConfigError("overrides", "nothing to translate", "give verl overrides or --file verl.yaml")
        return translate_overrides(args.overrides, use_verl_defaults)
    try:
        tree = load_yaml(Path(args.file).read_text())
    except yaml.YAMLError as err:
        raise ConfigError("--file", f"{args.file} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(tree, dict):
        raise ConfigError("--file", f"{args.file} does not hold a mapping of verl config sections")
    return translate_tree(tree, use_verl_defaults, args.overrides)


def _report(translation: Translation) -> None:
    for u in translation.unmapped:
        print(f"unmapped: {u.key}={u.value!r}: {u.reason}", file=sys.stderr)
    for c in translation.conversions:  # a value mapping only where it changed the value (`applied`)
        if c.how and c.applied and translation.quartet_values.get(c.quartet_key) == c.quartet_value:
            origin = "verl default " if c.from_default else ""
            change = f"{c.verl_key}={c.verl_value!r} -> {c.quartet_key}={c.quartet_value!r}"
            print(f"converted: {origin}{change} ({c.how})", file=sys.stderr)
    defaults = [c for c in translation.conversions if c.from_default and not (c.how and c.applied)]
    for c in defaults:
        print(f"verl default: {c.verl_key}={c.verl_value!r} -> {c.quartet_key}", file=sys.stderr)
