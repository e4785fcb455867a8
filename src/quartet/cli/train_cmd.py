"""`quartet train [CONFIG] [key=value ...]`: an RL run (PPO with a critic, GRPO and the critic-free kin).

The config is loaded and validated before anything starts: a typo or a batch size that does not divide
stops here with the dotted key and the fix, and no Ray actor is created. Exit status: 0 done, 1 the run
failed (bad data, a worker error), 2 the config is invalid, `trainer.preempt_exit_code` (75) preempted by
SIGTERM/SIGUSR1 after checkpointing (docs/reliability.md, "Preemption").
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from quartet.cli.console import command_console, quiet_transformers
from quartet.config import Backend, ConfigError, QuartetConfig, load_config

if TYPE_CHECKING:
    from quartet.trainer import RLResult

__all__ = ["FIRST_CONFIGS", "add_parser", "finished_text", "no_config_text", "run", "split_config_args"]


FIRST_CONFIGS = (
    ("examples/grpo_arithmetic/config.yaml", "GRPO on 2-digit addition, tiny model, SFT warm start first"),
    ("examples/ppo_arithmetic/config.yaml", "PPO with a critic, same task"),
    ("examples/single_cpu/config.yaml", "every role on one CPU bundle, memory planned"),
    ("examples/single_gpu/config.yaml", "one GPU, bring a model folder: model.path=DIR"),
)
"""The example configs `quartet train` names when it is given none (paths from the repository root)."""

EPILOG = """examples:
  quartet train examples/grpo_arithmetic/config.yaml
  quartet train examples/grpo_arithmetic/config.yaml trainer.total_steps=20 rollout.n=4
  quartet train cfg.yaml cluster.backend=local      # no Ray: one process, breakpoints work

every key, its default and what it does:  quartet config show --doc
the example configs:                      examples/README.md
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "train",
        help="RL training (PPO, GRPO, RLOO, ...) as the config says",
        description="RL training as a YAML config (and dotted key=value overrides) says.\nWith overrides "
        "only, the built-in defaults are trained: a tiny random model that gets no reward.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "config", nargs="?", help="YAML config file, e.g. examples/grpo_arithmetic/config.yaml"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. algorithm.adv_estimator=gae")
    parser.set_defaults(run=run, usage=parser.format_usage)


_TRAINER_MODULES = ("quartet.trainer", "rich.console")


def _connects_early(cfg: QuartetConfig) -> bool:
    """Connect to Ray (starting a local one or joining a cluster) and start the main pool's hosts while
    the trainer is imported: for a Ray run that goes straight to RL (an SFT warm start trains first, in
    this process, and would leave Ray idle meanwhile), in a process that has not imported the trainer yet
    (else there is nothing to overlap, and the run connects as it always did)."""
    return not (
        "quartet.trainer" in sys.modules or cfg.cluster.backend != Backend.RAY or cfg.trainer.sft_warm_start
    )


def _start_hosts_early(cfg: QuartetConfig) -> None:
    """The main pool's hosts, started under the run's names and told to import its roles' modules
    (`quartet.cluster.early_hosts`); the run's launch takes them."""
    from quartet.cluster.early_hosts import HOST_MODULES, ROLE_MODULES, start_early_hosts
    from quartet.cluster.naming import RunNames
    from quartet.config import plan_step

    c = cfg.cluster
    names = RunNames.for_run(c.namespace, c.run_prefix, cfg.trainer.experiment_name)
    start_early_hosts(c, names, [*HOST_MODULES, *(ROLE_MODULES[role] for role in plan_step(cfg).roles)])


def split_config_args(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """A first positional with '=' is an override, not a config file."""
    if args.config is not None and "=" in args.config:
        return None, [args.config, *args.overrides]
    return args.config, list(args.overrides)


def no_config_text(usage: str) -> str:
    """What `quartet train` says when given nothing: its usage, the example configs, where the keys are."""
    lines = [usage.rstrip(), "", "quartet train needs a config: nothing was started. Examples:"]
    lines += [f"  quartet train {path:<40} # {what}" for path, what in FIRST_CONFIGS]
    lines += ["", "every key and its default: quartet config show --doc; more configs: examples/README.md"]
    return "\n".join(lines)


def finished_text(result: RLResult) -> str:
    """The closing line: what this call trained, and of how many steps, without claiming a resumed run's
    earlier steps or a finished run's nothing."""
    took = f"in {result.seconds:.1f} s; run folder {result.run_dir}"
    if result.resumed_at is None:
        return f"done: {result.steps} steps {took}"
    if result.steps_this_run == 0:
        return (
            f"nothing trained this time: {result.run_dir} already holds {result.resumed_at} of "
            f"{result.total_steps} steps (trainer.resume=auto; the resume line above says how to go on)"
        )
    return (
        f"done: steps {result.resumed_at + 1}-{result.steps} of {result.total_steps} trained now "
        f"(resumed after step {result.resumed_at}) {took}"
    )


def run(args: argparse.Namespace) -> int:
    if args.config is None and not args.overrides:
        print(no_config_text(args.usage()), file=sys.stderr)
        return 2
    path, overrides = split_config_args(args)
    try:
        cfg: QuartetConfig = load_config(path, overrides)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    try:
        if _connects_early(cfg):  # Ray and the hosts start on this thread while another imports the trainer
            from quartet.cluster.ray_session import connect_while_importing

            connect_while_importing(cfg.cluster, _TRAINER_MODULES, then=partial(_start_hosts_early, cfg))
    except (ConnectionError, RuntimeError, ValueError) as err:
        print(f"run failed: {err}", file=sys.stderr)
        return 1
    try:
        return _train(cfg)
    finally:
        if "quartet.cluster.early_hosts" in sys.modules:  # hosts of a run that failed before its launch
            from quartet.cluster.early_hosts import discard_early_hosts

            discard_early_hosts()


def _train(cfg: QuartetConfig) -> int:
    from quartet.tracking import TrackerUnavailableError
    from quartet.trainer import RLTrainer

    quiet_transformers()
    console = command_console()
    console.rule(f"[bold]quartet train: {cfg.algorithm.adv_estimator} on {cfg.cluster.backend}")

    warm_start_s = 0.0
    try:
        if cfg.trainer.sft_warm_start:
            from quartet.cli.sft_cmd import sft_progress
            from quartet.trainer.loop.warm_start import sft_warm_start

            console.print("sft warm start (trainer.sft_warm_start): the sft section first", markup=False)
            began = time.perf_counter()
            cfg, start, trained = sft_warm_start(cfg, on_record=sft_progress(console, 200, val_every=10))
            warm_start_s = time.perf_counter() - began
            what = "trained" if trained else "found, reused"
            console.print(f"sft warm start {what}: RL starts from {start}", markup=False)
        trainer = RLTrainer(cfg, console=console)
        if warm_start_s:  # its time is no import: the startup record names it apart
            trainer.startup.set_aside("sft_warm_start", warm_start_s)
        result = trainer.run()
    except (ValueError, FileNotFoundError, RuntimeError, ConnectionError, TrackerUnavailableError) as err:
        # markup=False: an error text may hold rich tags, e.g. gloo's "[/__w/.../pair.cc:537] Read error"
        console.print(f"run failed: {err}", style="red", markup=False, soft_wrap=True)
        return 1
    if result.preempted is not None:  # checkpointed; the code a scheduler's requeue rule matches
        p = result.preempted
        console.print(
            f"preempted by {p.signal}: {result.run_dir} holds step {result.steps}; exit {p.exit_code} "
            "(trainer.preempt_exit_code); the same command resumes it (trainer.resume=auto)",
            markup=False,
            soft_wrap=True,
        )
        return p.exit_code
    console.print(finished_text(result), markup=False, soft_wrap=True)
    return 0
