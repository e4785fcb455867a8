"""What a Ray cluster holds, seen from outside a run: nodes, quartet runs and their actors, discovery.

`quartet doctor` prints this. Facts only, no printing here: `survey()` joins the cluster in its own
namespace (it only reads), and `probe_discovery()` starts a fresh Python process that finds a run's
workers by (address, namespace, prefix) and pings each one, the way a rollout server or an external tool
would.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quartet.cluster.connect import join_bounded, target_of
from quartet.cluster.naming import RunNames, parse_actor_name
from quartet.cluster.run_record import RankPlace, RunState, load_ranks, load_run_state

__all__ = [
    "ActorFacts",
    "ClusterSurvey",
    "NodeFacts",
    "ProbeResult",
    "RunFacts",
    "RunRecord",
    "classify_run",
    "death_of",
    "probe_discovery",
    "survey",
]

log = logging.getLogger(__name__)
DOCTOR_NAMESPACE = "quartet-doctor"
ENDED_BY_DRIVER = frozenset({"RAY_KILL", "OUT_OF_SCOPE"})  # a shutdown's ray.kill, its handles dropped
MAX_CAUSE = 300


@dataclass
class NodeFacts:
    node_id: str
    ip: str
    alive: bool
    cpus: float
    gpus: float
    memory_gib: float
    free_cpus: float
    free_gpus: float


@dataclass
class ActorFacts:
    name: str
    label: str
    rank: int
    state: str  # ALIVE, PENDING_CREATION, RESTARTING, DEAD; "unknown" without the state API
    pid: int
    node_id: str
    death_reason: str = ""
    """Ray's reason of a DEAD actor: RAY_KILL (a shutdown's `ray.kill`), WORKER_DIED, OWNER_DIED, NODE_DIED,
    OUT_OF_SCOPE, ... (`ray list actors --detail`'s death_cause)."""
    death_cause: str = ""
    """Ray's message about the death, shortened."""


@dataclass
class RunFacts:
    namespace: str
    prefix: str
    actors: list[ActorFacts] = field(default_factory=list)
    status: str = "live"
    """`live` (actors alive or starting), `finished` (its shutdown killed them, or its run_state.json says
    so), `failed` (run_state.json: the driver caught an error), `crashed` (an actor or the driver died
    otherwise); see `classify_run`."""
    cause: str = ""
    """Why a run is not live or finished: the error or the first death that was not a shutdown."""
    run_state: dict[str, Any] | None = None
    """The run folder's run_state.json (with --run-dir)."""

    @property
    def alive(self) -> int:
        return sum(a.state in ("ALIVE", "unknown") for a in self.actors)


@dataclass
class ProbeResult:
    namespace: str
    prefix: str
    expected: int
    ok: bool
    seconds: float
    pids: list[int] = field(default_factory=list)
    error: str = ""


@dataclass
class ClusterSurvey:
    address: str
    nodes: list[NodeFacts] = field(default_factory=list)
    runs: list[RunFacts] = field(default_factory=list)
    named_by_namespace: dict[str, int] = field(default_factory=dict)
    state_api: bool = True
    probes: list[ProbeResult] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


@dataclass
class RunRecord:
    """What a run folder records (`quartet.cluster.run_record`): names, state, where each rank ran."""

    names: RunNames
    state: RunState | None
    ranks: dict[str, list[RankPlace]]

    @staticmethod
    def load(run_dir: str | Path) -> RunRecord:
        return RunRecord(RunNames.load(run_dir), load_run_state(run_dir), load_ranks(run_dir))

    def apply(self, facts: ClusterSurvey) -> None:
        """Classify the folder's run anew with its state record; a run the cluster no longer lists any actor
        of is added from the record alone."""
        key = (self.names.namespace, self.names.prefix)
        runs = [r for r in facts.runs if (r.namespace, r.prefix) == key]
        if not runs and self.state is not None:
            runs = [RunFacts(*key)]
            facts.runs.append(runs[0])
        for r in runs:
            r.status, r.cause = classify_run(r, self.state)
            r.run_state = asdict(self.state) if self.state else None


def survey(address: str, only: tuple[str, str] | None = None) -> ClusterSurvey:
    """Join the cluster at `address` (`auto` finds the local one) and read its nodes and quartet runs
    (only the run `(namespace, prefix)` when given), each classified by `classify_run`."""
    import ray

    if not ray.is_initialized():  # in the cluster's auth mode; a refusal is named
        target = target_of(address, "--address")  # checked and bounded; a refused token is named
        quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
        join_bounded(target, DOCTOR_NAMESPACE, 10.0, retries=8, **quiet)
    facts = ClusterSurvey(str(ray.get_runtime_context().gcs_address))
    facts.nodes = _nodes()
    for named in ray.util.list_named_actors(all_namespaces=True):
        facts.named_by_namespace[named["namespace"]] = facts.named_by_namespace.get(named["namespace"], 0) + 1
    facts.runs, facts.state_api = _runs()
    if only is not None:
        facts.runs = [r for r in facts.runs if (r.namespace, r.prefix) == only]
    for run in facts.runs:
        run.status, run.cause = classify_run(run)
    return facts


def classify_run(run: RunFacts, state: RunState | None = None) -> tuple[str, str]:
    """(status, cause) of a run from its actors and, when known, its run folder's state record.

    A shutdown kills its actors with `ray.kill` (reason RAY_KILL), so a run whose actors all died that way
    ended: `finished` (the record tells a failed run apart). Any other death (worker process, owner or node
    died) is a crash, and so is a rank killed while others live, or actors killed while the record says
    running. An actor superseded by a live one of the same name (a relaunch) is not counted.
    """
    live_names = {a.name for a in run.actors if a.state != "DEAD"}
    current = [a for a in run.actors if a.state != "DEAD" or a.name not in live_names]
    dead = [a for a in current if a.state == "DEAD"]
    crashes = [a for a in dead if a.death_reason not in ENDED_BY_DRIVER]
    crash = "; ".join(f"{a.label}:{a.rank} {a.death_reason or 'DEAD'}: {a.death_cause}" for a in crashes[:3])
    if state is not None and state.state == "failed":
        return "failed", state.error + (f" ({crash})" if crash else "")
    if crashes:
        return "crashed", crash
    if state is not None and state.state == "finished":
        return "finished", ""
    if dead and len(dead) < len(current):
        down = ", ".join(f"{a.label}:{a.rank}" for a in dead)
        return "crashed", f"{down} killed by ray.kill while the other ranks live"
    if state is not None and state.state == "running":
        if state.driver_alive() is False:
            return "crashed", f"the driver (pid {state.driver_pid} on {state.hostname}) is gone"
        if dead:
            return "crashed", "its actors were killed (ray.kill) while run_state.json says running"
    if dead:
        return "finished", ""
    return "live", ""


def _nodes() -> list[NodeFacts]:
    import ray

    try:
        from ray._private.state import state  # per-node free resources; no public API without dashboard

        free = state.available_resources_per_node()  # type: ignore[no-untyped-call]
    except Exception:  # pragma: no cover - older/newer Ray: report totals only
        free = {}
    out = []
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        res, avail = node.get("Resources", {}), free.get(node["NodeID"], {})
        out.append(
            NodeFacts(
                node_id=node["NodeID"],
                ip=node["NodeManagerAddress"],
                alive=bool(node.get("Alive")),
                cpus=float(res.get("CPU", 0.0)),
                gpus=float(res.get("GPU", 0.0)),
                memory_gib=float(res.get("memory", 0.0)) / 2**30,
                free_cpus=float(avail.get("CPU", 0.0)),
                free_gpus=float(avail.get("GPU", 0.0)),
            )
        )
    return sorted(out, key=lambda n: (n.ip, n.node_id))


def _runs() -> tuple[list[RunFacts], bool]:
    """quartet runs by (namespace, prefix), from the state API (with states) or the named-actor list."""
    import ray

    rows: list[
        tuple[str, str, str, int, str, dict[str, Any] | None]
    ] = []  # ns, name, state, pid, node, death
    try:
        from ray.util.state import list_actors

        # the connected cluster's address: without it the state API refuses when several run on the host
        address = str(ray.get_runtime_context().gcs_address)
        listed = list_actors(
            address=address, limit=10000, timeout=10, detail=True, raise_on_missing_output=False
        )
        for actor in listed:
            if actor.name:
                rows.append(
                    (
                        actor.ray_namespace or "",
                        actor.name,
                        str(actor.state),
                        actor.pid or 0,
                        actor.node_id or "",
                        actor.death_cause,
                    )
                )
        state_api = True
    except Exception as err:  # no dashboard: live named actors only, without states
        log.debug("state API unavailable: %s", err)
        rows = [(a["namespace"], a["name"], "unknown", 0, "", None) for a in ray.util.list_named_actors(True)]
        state_api = False
    runs: dict[tuple[str, str], RunFacts] = {}
    for namespace, name, state, pid, node, death in rows:
        parsed = parse_actor_name(name)
        if parsed is None:
            continue
        prefix, label, rank = parsed
        run = runs.setdefault((namespace, prefix), RunFacts(namespace, prefix))
        run.actors.append(ActorFacts(name, label, rank, state, pid, node or "", *death_of(death)))
    for run in runs.values():
        run.actors.sort(key=lambda a: (a.label, a.rank, a.state != "ALIVE"))
    return sorted(runs.values(), key=lambda r: (r.namespace, r.prefix)), state_api


def death_of(cause: dict[str, Any] | None) -> tuple[str, str]:
    """(reason, short message) of a state-API `death_cause` ({"actor_died_error_context": {"reason": ...,
    "error_message": ...}} or another context); ("", "") for a live actor."""
    if not cause:
        return "", ""
    kind, context = next(iter(cause.items()))
    context = context if isinstance(context, dict) else {}
    reason = str(context.get("reason") or kind.removesuffix("_context").upper())
    message = " ".join(str(context.get("error_message", "")).split())
    return reason, message[:MAX_CAUSE] + ("..." if len(message) > MAX_CAUSE else "")


def _probe(argv: list[str]) -> dict[str, Any]:
    """In the fresh process of `probe_discovery`: find the workers, ping each, report pids or the error."""
    from quartet.cluster.discovery import find_workers

    address, namespace, prefix, expected, timeout = argv
    try:
        handles = find_workers(address, namespace, prefix, int(expected), timeout_s=float(timeout))
        import ray

        return {"pids": ray.get([h.ping.remote() for h in handles], timeout=float(timeout))}
    except Exception as err:  # reported to the parent as data, which names it in the doctor's output
        return {"error": f"{type(err).__name__}: {err}"}


def probe_discovery(
    address: str, namespace: str, prefix: str, expected: int, timeout_s: float = 20.0
) -> ProbeResult:
    """From a fresh process: find `expected` workers of the run and ping each (the whole round trip)."""
    start = time.monotonic()
    args = [sys.executable, "-m", __name__, address, namespace, prefix, str(expected), str(timeout_s)]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        return ProbeResult(
            namespace, prefix, expected, False, time.monotonic() - start, error="probe timed out"
        )
    seconds = time.monotonic() - start
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROBE ")), None)
    if line is None:
        return ProbeResult(namespace, prefix, expected, False, seconds, error=done.stderr[-1500:])
    data: dict[str, Any] = json.loads(line.removeprefix("PROBE "))
    if "error" in data:
        return ProbeResult(namespace, prefix, expected, False, seconds, error=data["error"])
    return ProbeResult(namespace, prefix, expected, len(data["pids"]) >= expected, seconds, pids=data["pids"])


if __name__ == "__main__":  # the probe's fresh process (see `probe_discovery`)
    sys.stdout.write("PROBE " + json.dumps(_probe(sys.argv[1:6])) + "\n")
