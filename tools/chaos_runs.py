"""The runs of the chaos soak (`tools/chaos_soak.py`): one `quartet train` driver at a time for a run
folder, what its metrics file says lately, the bitwise sync-mode leg, and the temp files runs leave."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from chaos_checks import check_steps, latest_checkpoint, same_weights, step_records
from chaos_procs import kill_all, reap_orphans, survivors

SYNC = [
    "cluster.backend=local",
    "data.builtin_train_size=16",
    "data.train_batch_size=4",
    "data.max_response_length=8",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=2",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-3",
    "actor.optim.warmup_steps=1",
    "actor.optim.schedule=cosine",
    "algorithm.adv_estimator=grpo",
    "trainer.total_steps=6",
    "trainer.save_freq=2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.max_checkpoints_to_keep=0",
    "trainer.loggers=[jsonl]",
    "trainer.experiment_name=sync",
]


def _quartet_script() -> str:
    """The `quartet` console script beside this interpreter (a venv's bin/), else the one on PATH."""
    beside = Path(sys.executable).with_name("quartet")
    found = str(beside) if beside.exists() else shutil.which("quartet")
    if found is None:
        raise FileNotFoundError("no `quartet` script beside this Python or on PATH: pip install -e . first")
    return found


class Driver:
    """One `quartet train` process at a time for one run folder, restarted with `trainer.resume=auto`."""

    def __init__(self, overrides: list[str], logs: Path, env: dict[str, str], run_dir: Path) -> None:
        self.overrides, self.logs, self.env, self.run_dir = overrides, logs, env, run_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.attempt = 0
        self.log_path = logs / "none.log"
        self.started_wall = 0.0

    def start(self, *extra: str) -> None:
        self.attempt += 1
        self.log_path = self.logs / f"driver-{self.attempt}.log"
        quartet = _quartet_script()
        argv = [str(quartet), "train", *self.overrides, "trainer.resume=auto", *extra]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        self.started_wall = time.time()

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else -1

    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout_s: float) -> bool:
        """Whether the driver exited within `timeout_s` (its orphans are reaped meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                return True
            reap_orphans({self.pid})
            time.sleep(0.25)
        return not self.alive()

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").split("\n")
        except OSError:
            return []

    def stop_tree(self, grace_s: float = 30.0) -> list[int]:
        """Wait for what the exited driver started to go (its reaper cleans Ray up); kill what is left."""
        assert self.proc is not None
        left = [p for p in survivors(os.getpid(), grace_s, {self.pid}) if p != self.pid]
        kill_all(left)
        return left


def recent(run_dir: Path, tail_bytes: int = 1 << 18) -> list[dict[str, Any]]:
    """The records in the last `tail_bytes` of `metrics.jsonl` (polled 4 times a second: an hour's file is
    tens of MB, reading it whole each time would load the machine the soak measures)."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
            lines = f.read().decode(errors="replace").split("\n")[1:]  # the first may be cut
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def trained_since(run_dir: Path, wall: float) -> dict[str, Any] | None:
    """The first step record written after Unix time `wall`."""
    return next((r for r in records_since(run_dir, wall) if r.get("kind") == "step"), None)


def records_since(run_dir: Path, wall: float) -> list[dict[str, Any]]:
    """The metrics records written after Unix time `wall` (a record of the resumed run names its resume)."""
    return [r for r in recent(run_dir) if float(r.get("time", 0)) > wall]


def leftovers(tmp: Path, rays: set[str]) -> dict[str, Any]:
    """Files the runs left in their temp folder (`TMPDIR`), aside from Ray's: its session logs (kept by
    design) and the socket folders of its dashboard's forkserver (`rays`, seen while the runs lived)."""
    ours: list[str] = []
    by_ray: list[str] = []
    for path in sorted(tmp.rglob("*")):
        top = tmp / path.relative_to(tmp).parts[0]
        if top.name != "ray":
            (by_ray if str(top) in rays else ours).append(str(path.relative_to(tmp)))
    ray = tmp / "ray"
    size = sum(p.stat().st_size for p in ray.rglob("*") if p.is_file()) if ray.exists() else 0
    return {
        "passed": not ours,
        "count": len(ours),
        "paths": ours[:30],
        "ray_session_logs_bytes": size,
        "left_by_ray_dashboard_forkserver": by_ray[:30],
    }


def sync_leg(work: Path, model: Path, env: dict[str, str], rng: random.Random) -> dict[str, Any]:
    """An uninterrupted sync run and one whose driver is SIGKILLed after a random step and resumed: the
    final weights must be equal bit for bit (CPU, fp32, the local backend)."""
    env = {**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "0", "MASTER_PORT": "0"}
    (work / "sync-logs").mkdir(exist_ok=True)
    runs = {}
    for name in ("straight", "killed"):
        out = work / f"sync-{name}"
        runs[name] = Driver(
            [*SYNC, f"model.path={model}", f"trainer.output_dir={out}"],
            work / "sync-logs",
            env,
            out / "quartet" / "sync",
        )
        runs[name].logs = work / "sync-logs"
    runs["straight"].start()
    runs["straight"].wait(900)
    kill_at = rng.randint(3, 5)
    killed = runs["killed"]
    killed.start()
    deadline = time.monotonic() + 900
    while killed.alive() and time.monotonic() < deadline:
        if any(int(r["step"]) >= kill_at for r in step_records(killed.run_dir)):
            kill_all([killed.pid])
            break
        time.sleep(0.05)
    killed.wait(60)
    stopped_at = max((int(r["step"]) for r in step_records(killed.run_dir)), default=0)
    resumed_from = latest_checkpoint(killed.run_dir)
    killed.stop_tree(10)
    killed.start()
    killed.wait(900)
    codes = [runs["straight"].proc.returncode, killed.proc.returncode]  # type: ignore[union-attr]
    files = [r.run_dir / "hf" / "model.safetensors" for r in runs.values()]
    differ = same_weights(*files) if all(f.exists() for f in files) else ["a model file is missing"]
    steps = check_steps(killed.run_dir, 6)
    return {
        "passed": codes == [0, 0] and stopped_at < 6 and not differ and steps["passed"],
        "killed_after_step": stopped_at,
        "resumed_from_step": resumed_from,
        "exit_codes": codes,
        "tensors_differing": differ,
        "steps": steps,
    }
