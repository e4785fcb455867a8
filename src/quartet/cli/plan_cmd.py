"""`quartet plan [CONFIG] [key=value ...]`: will the run fit its device, and what to change if it does not.

Prints the model it planned (`model.path`'s folder or the built-in tiny model), the memory plan
(`quartet.planning`: per phase and role, on one bundle), the free memory it is checked against and, when it
does not fit, the cheapest config changes that make it fit (the overrides to pass, or `trainer.auto_fit=true`
to apply them). A GPU config that names no model gets a note: its figures are the default tiny model's.
Nothing starts: no Ray, no model weights (config.json files only).

The memory is this machine's, or `--memory-gib N`, or `--gpu NAME`'s nominal memory (`planning.gpus`; it
implies a GPU plan). The two options exclude each other. A GPU plan on a machine without CUDA and without
either is refused with how to give one. Exit status: 0 fits, 3 does not fit (the proposal is printed),
2 the config or the options are invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from quartet.cli.train_cmd import split_config_args
from quartet.config import ConfigError, load_config
from quartet.planning.gpus import NOMINAL_GIB, UnknownGpuError, gpu_memory_bytes, known_gpus

if TYPE_CHECKING:
    from quartet.planning.fit import FitReport

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
        help="plan for this device (default: cluster.device; --gpu implies gpu)",
    )
    memory = parser.add_mutually_exclusive_group()
    memory.add_argument(
        "--memory-gib",
        type=float,
        default=None,
        help="free device memory to plan for, instead of this machine's (not with --gpu)",
    )
    memory.add_argument(
        "--gpu",
        default=None,
        metavar="NAME",
        help=f"plan for this GPU's nominal memory, from any machine (implies --device gpu; not with "
        f"--memory-gib): {', '.join(NOMINAL_GIB)}",
    )
    parser.add_argument(
        "--step-times",
        default=None,
        metavar="GEN,TRAIN",
        help="async/one_step_off: each pool's measured busy seconds per step, for the split advice",
    )
    parser.add_argument("--json", action="store_true", help="print the plan and the proposal as JSON")
    parser.set_defaults(run=run)


def _option_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with `--gpu` (an unknown name, or with `--device cpu`), or None."""
    if args.gpu is None:
        return None
    if args.device == "cpu":
        return "--gpu plans for a GPU; drop --device cpu (or drop --gpu to plan for this machine's CPU)"
    try:
        gpu_memory_bytes(args.gpu)
    except UnknownGpuError as err:
        return str(err)
    return None


def _no_cuda_message() -> str:
    example = next(iter(NOMINAL_GIB))
    return (
        f"no CUDA device here; pass --gpu {example} or --memory-gib N to plan for a GPU you will run on "
        f"(known GPUs: {known_gpus()}); --device cpu plans for this machine's CPU instead"
    )


def run(args: argparse.Namespace) -> int:
    from quartet.planning.estimate import resolve_device
    from quartet.planning.fit import NoCudaDeviceError, detect_capacity, fit_config
    from quartet.planning.model_shape import UnknownModelShapeError
    from quartet.planning.notes import planned_model, unnamed_model_note
    from quartet.planning.role_shapes import resolve_shapes
    from quartet.trainer.records.split_advice_log import plan_advice

    problem = _option_problem(args)
    if problem:
        print(f"quartet plan: {problem}", file=sys.stderr)
        return 2
    path, overrides = split_config_args(args)
    try:
        cfg = load_config(path, overrides)
        kind = resolve_device(cfg, "gpu" if args.gpu else args.device)
        memory = None if args.memory_gib is None else int(args.memory_gib * 2**30)
        capacity = detect_capacity(kind, memory, args.gpu)
        shapes = resolve_shapes(cfg)
        report = fit_config(cfg, device=kind, capacity=capacity, shapes=shapes)
        advice = plan_advice(cfg, kind, args.step_times)  # the split advisor (docs/async.md)
    except NoCudaDeviceError:
        print(f"quartet plan: {_no_cuda_message()}", file=sys.stderr)
        return 2
    except (ConfigError, UnknownModelShapeError, FileNotFoundError, ValueError) as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    model = planned_model(cfg, shapes.policy)
    note = unnamed_model_note(cfg, kind)
    if args.json:
        params = shapes.policy.total_params
        active = shapes.policy.active_params  # = params for a dense model
        about = {"name": model, "path": cfg.model.path or None, "params": params, "active_params": active}
        _print_json(report, advice, about | {"note": note})
    else:
        print(f"model: {model}")
        print(report.plan.render_table())
        print(report.render())
        if advice:
            print(advice)
        if note:
            print(f"note: {note}")
    return 0 if report.fits else EXIT_DOES_NOT_FIT


def _print_json(report: FitReport, advice: str | None, model: dict[str, Any]) -> None:
    """The plan, its capacity (with its source: measured, given or a named GPU) and the proposal, as JSON;
    `model` says which model was planned and carries the note of a GPU config that names none."""
    out = {
        "model": model,
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
        "hint": report.hint and {"overrides": list(report.hint.overrides), "frees_bytes": report.hint.freed},
        "fitted_plan": report.fitted_plan.to_dict() if report.fitted_plan else None,
        "split_advice": advice,
    }
    print(json.dumps(out, indent=2))
