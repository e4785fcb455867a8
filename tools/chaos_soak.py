"""Chaos soak: drive `quartet train` through random faults and check that nothing was lost.

    .venv/bin/python tools/chaos_soak.py --minutes 60 --seed 0          # the hour-long run
    .venv/bin/python tools/chaos_soak.py --minutes 2 --kinds driver,torn_metrics --out /tmp/soak.json

One async run (the built-in arithmetic task, `trainer.mode=async` with the rollout on a pool of its own, a
tiny model built here, a checkpoint every 3 steps) trains for `--minutes`. Meanwhile, at random moments
(seeded), one fault at a time is injected into that run's own processes, found through the run's own
records (`run_state.json` for the driver, `cluster.json` for the rank pids, the driver's children for the
reward workers) and each checked to be a descendant of the current driver before it is signalled:

  actor_host       SIGKILL of the actor's host process (role `rl` rank 0)
  rollout_replica  SIGKILL of a rollout replica (role `rollout`): the run restarts it, no resume
  reward_worker    SIGKILL of a reward scoring worker (a child of the driver)
  driver           SIGKILL of the driver
  hang             SIGSTOP of the actor's host: the watchdog must name it (then SIGCONT)
  disk_full        the checkpoints folder (a small tmpfs mounted there) filled before a save
  torn_metrics     the driver SIGKILLed, then a partial JSON line appended to metrics.jsonl
  preempt          SIGTERM of the driver: it saves, exits 75 within its grace, is resumed (chaos_preempt.py)
  resize           the driver SIGKILLed, then resumed on another world size (tools/chaos_resize.py)

After each, the run is resumed as a user would (`quartet train ... trainer.resume=auto`) when it stopped,
and the tool records when quartet named the fault (the first log line that says what happened, or the hang
file) and when the next step was trained. Once the time is up the run ends at its latest checkpoint + 2
steps, and the soak checks: every step trained exactly once, every prompt drawn exactly once per epoch in
the sampler's order (`tools/chaos_checks.py`), no process of the soak's runs left (`tools/chaos_procs.py`),
no file left in the runs' temp folder; and a short sync run (local backend) killed once and resumed must
end with the weights of an uninterrupted one, bit for bit (the runs: `tools/chaos_runs.py`). `--out`
(JSON) is rewritten after every fault.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_checks import check_prompts, check_steps, latest_checkpoint, recheck_prompts
from chaos_config import (
    ASYNC,
    BATCH,
    CALL_TIMEOUT_S,
    DRIVER_KILLS,
    KINDS,
    MAX_STEPS,
    PATTERNS,
    RESTARTS,
    ROOT,
    ROWS,
    SEED,
    N,
)
from chaos_preempt import after_preempt
from chaos_procs import (
    alive,
    become_subreaper,
    cmdline,
    descendants,
    fill,
    is_descendant,
    kill_all,
    mount_tmpfs,
    ray_dashboard_temp_dirs,
    reap_orphans,
    survivors,
    unmount,
)
from chaos_resize import resize
from chaos_runs import Driver, leftovers, recent, records_since, sync_leg, trained_since
from chaos_targets import first_match, rank_pid, reward_worker


def _now(t0: float) -> float:
    return round(time.monotonic() - t0, 2)


class Soak:
    """The fault loop over one async run, its end checks, and the JSON it keeps up to date."""

    def __init__(self, args: argparse.Namespace, work: Path, model: Path) -> None:
        self.args, self.work, self.t0 = args, work, time.monotonic()
        self.rng = random.Random(args.seed)
        self.run_dir = work / "out" / "quartet" / "soak"
        self.tmp = work / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(self.tmp), "RAY_TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH", "")]))
        for key in ("RAY_ADDRESS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        self.env = env
        overrides = [
            *ASYNC,
            f"model.path={model}",
            f"trainer.output_dir={work / 'out'}",
            f"cluster.namespace=soak-{os.getpid()}",
            f"trainer.hang_timeout_s={args.hang_timeout}",
            f"trainer.total_steps={MAX_STEPS}",
        ]
        (work / "logs").mkdir(exist_ok=True)
        self.driver = Driver(overrides, work / "logs", env, self.run_dir)
        self.kinds = [k for k in args.kinds.split(",") if k]
        self.faults: list[dict[str, Any]] = []
        self.unprovoked: list[dict[str, Any]] = []
        self.loads: list[float] = []
        self.disk = "not used"
        self.queue: list[str] = []
        self.total: int | None = None  # the run's last step, set by the last restart
        self.rays: set[str] = set()  # temp folders of Ray's dashboard forkserver (`ray_dashboard_temp_dirs`)
        self.failed_line: str | None = None  # the driver's one-line failure of the last fault, if any
        self.fault_start = 0  # the driver log's line count when the last fault was injected
        self.out: dict[str, Any] = {
            "tool": "tools/chaos_soak.py",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "minutes": args.minutes,
            "seed": args.seed,
            "hang_timeout_s": args.hang_timeout,
            "kinds": self.kinds,
            "config": ASYNC,
            "finished": False,
        }

    # ---- bookkeeping ------------------------------------------------------------------------------------

    def save(self) -> None:
        self.loads.append(os.getloadavg()[0])
        totals: dict[str, dict[str, Any]] = {}
        for kind in self.kinds:
            rows = [f for f in self.faults if f["kind"] == kind]
            named = sorted(f["named_after_s"] for f in rows if f["named_after_s"] is not None)
            rec = sorted(f["recovered_after_s"] for f in rows if f["recovered_after_s"] is not None)
            totals[kind] = {
                "injected": len(rows),
                "named": len(named),
                "recovered": len(rec),
                "named_after_s_median": named[len(named) // 2] if named else None,
                "recovered_after_s_median": rec[len(rec) // 2] if rec else None,
            }
        self.out.update(
            elapsed_s=_now(self.t0),
            machine={
                "cpus": os.cpu_count(),
                "load_avg_1min": {"min": min(self.loads), "max": max(self.loads), "samples": self.loads},
            },
            disk_full_method=self.disk,
            faults=self.faults,
            totals=totals,
            unprovoked_failures=self.unprovoked,
        )
        path = Path(self.args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.out, indent=1) + "\n")
        tmp.replace(path)

    def log(self, msg: str) -> None:
        print(f"[{_now(self.t0):8.1f} s] {msg}", flush=True)

    # ---- waiting ------------------------------------------------------------------------------------------

    def wait_for(self, probe: Any, timeout_s: float) -> tuple[float | None, Any]:
        """Poll `probe()` until it returns something truthy: (monotonic time, that value) or (None, None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = probe()
            if got:
                return time.monotonic(), got
            reap_orphans({self.driver.pid})
            time.sleep(0.25)
        return None, None

    def restart(self, *extra: str) -> float:
        """Start the driver again (after the last one's processes went); the Unix time it started. Once the
        time is up, the restart is the last one: it trains to the latest checkpoint + 2 steps and ends."""
        left = self.driver.stop_tree()
        if left:
            self.log(f"killed {len(left)} processes the stopped run left: {left}")
        if not extra and self.over():
            self.total = latest_checkpoint(self.run_dir) + 2
            extra = (f"trainer.total_steps={self.total}",)
            self.log(f"time is up: the run resumes to end at step {self.total}")
        self.driver.start(*extra)
        return self.driver.started_wall

    def recover(self, since_wall: float) -> float | None:
        """When the next step after `since_wall` was trained (monotonic), None if not within the timeout."""
        t, _ = self.wait_for(lambda: trained_since(self.run_dir, since_wall), self.args.recover_timeout)
        self.rays |= ray_dashboard_temp_dirs(self.driver.pid)
        return t

    # ---- one fault ----------------------------------------------------------------------------------------

    def target(self, kind: str) -> int:
        """The pid this fault signals, from the run's own records; -1 when there is none to hit."""
        drv = self.driver
        if kind in (*DRIVER_KILLS, "preempt"):
            state = json.loads((self.run_dir / "run_state.json").read_text())
            pid = int(state["driver_pid"])
            return pid if pid == drv.pid else -1
        if kind == "reward_worker":
            return reward_worker(drv.pid, self.rng)
        if kind in ("actor_host", "hang", "rollout_replica"):
            pid = rank_pid(self.run_dir, "rollout" if kind == "rollout_replica" else "rl", self.rng)
            return pid if pid > 0 and is_descendant(pid, drv.pid) else -1
        return 0  # disk_full: no process

    def inject(self, kind: str) -> dict[str, Any] | None:
        """Inject one fault, see it named and recovered; the row for the table (None: nothing to hit)."""
        self.rays |= ray_dashboard_temp_dirs(self.driver.pid)
        pid = self.target(kind)
        self.failed_line = None
        if pid < 0:
            self.log(f"{kind}: no target in this run right now; skipped")
            return None
        row: dict[str, Any] = {"kind": kind, "pid": pid, "injected_at_s": _now(self.t0)}
        row["step_before"] = max((int(r["step"]) for r in recent(self.run_dir) if "step" in r), default=0)
        t_inj, wall_inj, start = time.monotonic(), time.time(), len(self.driver.log_lines())
        if kind in (*DRIVER_KILLS, "actor_host", "rollout_replica", "reward_worker"):
            os.kill(pid, signal.SIGKILL)
        elif kind == "preempt":
            os.kill(pid, signal.SIGTERM)
        elif kind == "hang":
            os.kill(pid, signal.SIGSTOP)
        else:
            row["filled_bytes"] = fill(self.run_dir / "checkpoints", 16 << 10)
        self.log(f"injected {kind} (pid {pid})")
        if kind in DRIVER_KILLS:
            named_t, message, since = self._after_driver_kill(kind)
        elif kind == "preempt":
            named_t, message, since = after_preempt(self, row, start, wall_inj)
        else:
            named_t, message = self._named_in_run(kind, pid, start, wall_inj)
            since = wall_inj
            if kind in RESTARTS:
                since = self._restart_after(kind, pid, row)
        rec_t = self.recover(since)
        row["run_failed"] = self.failed_line
        row.update(
            named_after_s=round(named_t - t_inj, 2) if named_t else None,
            message=message,
            recovered_after_s=round(rec_t - t_inj, 2) if rec_t else None,
            attempt=self.driver.attempt,
        )
        return row

    def _named_in_run(self, kind: str, pid: int, start: int, wall: float) -> tuple[float | None, str | None]:
        """Wait for the running (or failing) driver to name the fault: a log line, the hang file, or (a
        reward worker) a step record counting a worker restart."""
        pattern = PATTERNS[kind].format(pid=pid)

        def probe() -> str | None:
            line = first_match(self.driver.log_lines(), start, pattern)
            if line:
                return line
            if kind == "hang":
                hangs = [p for p in self.run_dir.glob("hang_*.txt") if p.stat().st_mtime > wall]
                if hangs:
                    return f"{hangs[0].name}: {hangs[0].read_text(errors='replace').splitlines()[0][:250]}"
            if kind == "reward_worker":
                for rec in records_since(self.run_dir, wall):
                    if rec.get("kind") == "step" and rec.get("reward/worker_restarts", 0) > 0:
                        return f"step {rec['step']}: reward/worker_restarts={rec['reward/worker_restarts']}"
            return None

        hang = max(self.args.hang_timeout, CALL_TIMEOUT_S) if kind == "hang" else 0
        timeout = self.args.name_timeout + hang
        t, message = self.wait_for(probe, timeout)
        self.fault_start = start
        if kind == "hang" and message and not message.startswith("hang_"):
            self.wait_for(lambda: list(self.run_dir.glob("hang_*.txt")), 30)  # the file comes with the line
        return t, message

    def _restart_after(self, kind: str, pid: int, row: dict[str, Any]) -> float:
        """The run stopped (or must be stopped): let the driver exit, undo the fault, resume."""
        if kind == "hang" and alive(pid):
            os.kill(pid, signal.SIGCONT)  # so the shutdown that follows the named hang can proceed
        if not self.driver.wait(self.args.exit_timeout):
            row["note"] = f"the driver did not exit within {self.args.exit_timeout} s: killed"
            kill_all([self.driver.pid])
            self.driver.wait(30)
        row["driver_exit"] = self.driver.returncode()
        self.failed_line = first_match(self.driver.log_lines(), self.fault_start, r"^run failed")
        if kind == "hang" and alive(pid):
            kill_all([pid])
        if kind == "disk_full":
            (self.run_dir / "checkpoints" / "soak_filler.bin").unlink(missing_ok=True)
        return self.restart()

    def _after_driver_kill(self, kind: str) -> tuple[float | None, str | None, float]:
        """A killed driver names nothing itself: the resumed run's log does (where it resumed from; a torn
        metrics line dropped)."""
        self.driver.wait(30)
        if kind == "torn_metrics":
            self.restart_prep_torn()
        if kind == "resize":
            old, new = resize(self.driver.overrides)
            self.log(f"resize: {old} -> {new} bundles per node")
        since = self.restart()

        def probe() -> str | None:
            line = first_match(self.driver.log_lines(), 0, PATTERNS[kind])
            if line or kind == "torn_metrics":
                return line
            notes = [r for r in records_since(self.run_dir, since) if r.get("kind") == "resume"]
            if kind == "resize":
                notes = [r for r in notes if re.search(PATTERNS[kind], r.get("note", ""))]
            return f"metrics.jsonl resume record: {notes[0].get('note', '')}"[:300] if notes else None

        t, message = self.wait_for(probe, self.args.recover_timeout)
        return t, message, since

    def restart_prep_torn(self) -> None:
        self.driver.stop_tree()
        with open(self.run_dir / "metrics.jsonl", "a") as f:
            f.write('{"kind": "step", "step": 99999, "time": 17')  # a write cut short: no newline

    # ---- the loop -----------------------------------------------------------------------------------------

    def schedule(self) -> list[str]:
        """Every kind once first (in a seeded order), then seeded random choices."""
        first = list(self.kinds)
        self.rng.shuffle(first)
        return first

    def gap(self, seconds: float) -> bool:
        """Let the run train for `seconds`; a driver that stops on its own meanwhile is recorded and resumed.
        False when the soak's time is up."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.over():
                return False
            if not self.driver.alive():
                tail = self.driver.log_lines()[-3:]
                self.unprovoked.append(
                    {"at_s": _now(self.t0), "exit": self.driver.returncode(), "tail": tail}
                )
                self.log(f"the driver stopped on its own: {tail}")
                self.recover(self.restart())
            reap_orphans({self.driver.pid})
            time.sleep(0.5)
        return True

    def over(self) -> bool:
        """Time is up, and every kind was injected at least once."""
        return not self.queue and bool(time.monotonic() - self.t0 > self.args.minutes * 60)

    def loop(self) -> None:
        self.driver.start()
        if self.recover(self.driver.started_wall) is None:
            raise RuntimeError(f"the first run trained no step: {self.driver.log_lines()[-20:]}")
        self.queue = self.schedule()
        while self.gap(self.rng.uniform(self.args.gap_min, self.args.gap_max)):
            kind = self.queue.pop(0) if self.queue else self.rng.choice(self.kinds)
            try:
                row = self.inject(kind)
            except Exception as exc:  # a bug of the tool, not of the run: recorded, and the soak goes on
                self.unprovoked.append({"at_s": _now(self.t0), "tool_error": f"{kind}: {exc!r}"})
                self.log(f"{kind}: the tool failed: {exc!r}")
                continue
            if row is not None:
                self.faults.append(row)
                self.log(
                    f"{kind}: named after {row['named_after_s']} s, recovered after "
                    f"{row['recovered_after_s']} s: {row['message']}"
                )
                if row["recovered_after_s"] is None:
                    self.log("not recovered: restarting the run")
                    kill_all([self.driver.pid])
                    self.driver.wait(30)
                    self.recover(self.restart())
            self.save()

    def finish(self) -> dict[str, Any]:
        """Let the run end at its latest checkpoint + 2 steps (when the last fault's restart did not set
        that: kill, resume with that many steps) and check it; then the processes and files it left."""
        if self.total is None:  # the last fault left the run going: stop it, resume it to its end
            kill_all([self.driver.pid])
            self.driver.wait(60)
            self.total = latest_checkpoint(self.run_dir) + 2
            self.restart(f"trainer.total_steps={self.total}")
            self.recover(self.driver.started_wall)
        total = self.total
        ended = self.driver.wait(self.args.recover_timeout + 600)
        rc = self.driver.proc.returncode if self.driver.proc else None
        state = json.loads((self.run_dir / "run_state.json").read_text())
        checks: dict[str, Any] = {
            "final_run": {
                "passed": ended and rc == 0 and state["state"] == "finished",
                "exit": rc,
                "state": state["state"],
            }
        }
        checks["steps"] = check_steps(self.run_dir, total)
        checks["prompts"] = check_prompts(self.run_dir, total, BATCH, N, ROWS, SEED)
        left = survivors(os.getpid(), 60.0, {self.driver.pid})
        checks["orphans"] = {
            "passed": not left,
            "count": len(left),
            "processes": [f"{p} {cmdline(p)[:120]}" for p in left],
        }
        kill_all(left)
        return checks


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--minutes", type=float, default=60.0, help="how long faults are injected (at least each kind once)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {','.join(KINDS)}")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "chaos_soak.json"))
    p.add_argument("--gap-min", type=float, default=20.0, help="least seconds of training between faults")
    p.add_argument("--gap-max", type=float, default=90.0)
    p.add_argument("--hang-timeout", type=float, default=60.0, help="trainer.hang_timeout_s of the run")
    p.add_argument("--name-timeout", type=float, default=180.0, help="seconds to wait for a fault's name")
    p.add_argument("--exit-timeout", type=float, default=180.0, help="seconds for a failed driver to exit")
    p.add_argument("--recover-timeout", type=float, default=600.0, help="seconds to the next step trained")
    p.add_argument("--no-sync-leg", action="store_true", help="skip the bitwise sync-mode check")
    p.add_argument("--keep", action="store_true", help="keep the work folder (runs, logs) for reading")
    p.add_argument("--recheck-prompts", metavar="RUN_DIR", help="only redo the prompt check of --out")
    args = p.parse_args()
    bad = [k for k in args.kinds.split(",") if k and k not in KINDS]
    if bad:
        p.error(f"--kinds: unknown {bad}; choose from {','.join(KINDS)}")
    return args


def _model(work: Path) -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from quartet.config import TinyModelConfig
    from quartet.models.tiny import ensure_tiny_model

    return Path(ensure_tiny_model(TinyModelConfig(), work / "models"))


def _stop(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGINT: leave through `main`'s cleanup (a background job of a shell ignores SIGINT)."""
    raise SystemExit(128 + signum)


def main() -> int:
    args = _args()
    if args.recheck_prompts:
        return 0 if recheck_prompts(Path(args.out), Path(args.recheck_prompts), BATCH, N, ROWS, SEED) else 1
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    work = Path(tempfile.mkdtemp(prefix="soak", dir="/tmp"))  # short: Ray's socket paths must stay short
    if not become_subreaper():
        print("cannot become a child subreaper: orphans would escape the count", file=sys.stderr)
        return 2
    soak = Soak(args, work, _model(work))
    mnt = soak.run_dir / "checkpoints"
    mounted = False
    try:
        if "disk_full" in soak.kinds:
            why = mount_tmpfs(mnt, 32)
            mounted = not why
            soak.disk = (
                "a 32 MiB tmpfs mounted at the run's checkpoints folder, filled to 16 KiB free by one "
                "fallocate'd file before a save; removed before the resume"
                if mounted
                else f"skipped: {why}"
            )
            if not mounted:
                soak.kinds.remove("disk_full")
        soak.save()
        soak.loop()
        soak.log("time is up: the run ends at its latest checkpoint + 2 steps")
        checks = soak.finish()
        checks["leftover_files"] = leftovers(soak.tmp, soak.rays)
        soak.out["checks"] = checks
        soak.save()
        if not args.no_sync_leg:
            checks["sync_bitwise"] = sync_leg(work, _model(work), soak.env, soak.rng)
        soak.out["checks"] = checks
        faults_ok = all(
            f["named_after_s"] is not None and f["recovered_after_s"] is not None for f in soak.faults
        )
        soak.out["passed"] = faults_ok and all(c["passed"] for c in checks.values())
        soak.out["finished"] = True
        soak.save()
        soak.log(f"done: passed={soak.out['passed']}; {args.out}")
        return 0 if soak.out["passed"] else 1
    finally:
        kill_all(descendants(os.getpid()))
        if mounted:
            unmount(mnt)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
