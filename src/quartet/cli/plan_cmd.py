"""`quartet plan [CONFIG] [key=value ...]`: will the run fit its device, and what to change if it does not.

Prints the memory plan (`quartet.planning`: per phase and role, on one bundle), the free memory it is
checked against and, when it does not fit, the cheapest config changes that make it fit (the overrides to
pass, or `trainer.auto_fit=true` to apply them). Nothing starts: no Ray, no model weights (config.json
files only). Exit status: 0 fits, 3 does not fit (the proposal is printed), 2 the config is invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from quartet.cli.train_cmd import split_config_args
from quartet.config import ConfigError, load_config

__all__ = ["add_parser", "run"]

EXIT_DOES_NOT_FIT = 3


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "plan", help="estimate a run's memory per phase; propose changes if it does not fit"
    )
    parser.add_argument("config", nargs="?", help="YAML config file (default: the built-in defaults)")
    parser.add_argument(
        "overrides", nargs="*", help="dotted overrides, e.g. actor.micro_batch_size_per_device=4"
    )
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "gpu"],
        default=None,
        help="plan for this device (default: cluster.device)",
    )
    parser.add_argument(
        "--memory-gib",
        type=float,
        default=None,
        help="free device memory to plan for, instead of this machine's",
    )
    parser.add_argument(
        "--step-times",
        default=None,
        metavar="GEN,TRAIN",
        help="async/one_step_off: each pool's measured busy seconds per step, for the split advice",
    )
    parser.add_argument("--json", action="store_true", help="print the plan and the proposal as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from quartet.planning.estimate import resolve_device
    from quartet.planning.fit import detect_capacity, fit_config
    from quartet.planning.model_shape import UnknownModelShapeError
    from quartet.trainer.records.split_advice_log import plan_advice

    path, overrides = split_config_args(args)
    try:
        cfg = load_config(path, overrides)
        kind = resolve_device(cfg, args.device)
        memory = None if args.memory_gib is None else int(args.memory_gib * 2**30)
        report = fit_config(cfg, device=kind, capacity=detect_capacity(kind, memory))
        advice = plan_advice(cfg, kind, args.step_times)  # the split advisor (docs/async.md)
    except (ConfigError, UnknownModelShapeError, FileNotFoundError, ValueError) as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    if args.json:
        out = {
            "plan": report.plan.to_dict(),
            "capacity": {
                "device": report.capacity.device,
                "device_bytes": report.capacity.device_bytes,
                "host_bytes": report.capacity.host_bytes,
                "source": report.capacity.source,
            },
            "fits": report.fits,
            "proposal": report.overrides,
            "fits_with_proposal": report.fits_after,
            "fitted_plan": report.fitted_plan.to_dict() if report.fitted_plan else None,
            "split_advice": advice,
        }
        print(json.dumps(out, indent=2))
    else:
        print(report.plan.render_table())
        print(report.render())
        if advice:
            print(advice)
    return 0 if report.fits else EXIT_DOES_NOT_FIT
