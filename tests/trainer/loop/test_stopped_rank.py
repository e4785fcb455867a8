"""A rank frozen by SIGSTOP mid-step is named within `trainer.hang_timeout_s` plus a small margin, with its
Python stack (read by py-spy) and its state, and the run ends without waiting on it again.

A real GRPO run of the tiny model on the suite's local Ray; the test stops the host process of the run's
ranks while it is inside a role call (stopping and continuing it until py-spy sees the host's `call`
frame), then continues its own stopped process and leaves the rest to the run's shutdown.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from quartet.cluster.stopped_stacks import process_state, py_spy_stacks
from quartet.cluster.watchdog import DUMP_WAIT_S, HangError
from quartet.config import load_config
from quartet.trainer.loop.rl_trainer import RLTrainer

HANG_S = 3.0
NAMED_MARGIN_S = DUMP_WAIT_S
"""The stated bound past the phase deadline for naming a rank on the driver's node (docs/reliability.md)."""
END_MARGIN_S = 8.0
"""The run's end after the named hang: no ping of the silent rank, no clean engine stop on it (before: 10 s
each, on top of the 5 s the handler was waited for)."""


def _first_step_done(run_dir: Path) -> bool:
    metrics = run_dir / "metrics.jsonl"
    return metrics.exists() and '"kind": "step"' in metrics.read_text()


def _stop_inside_a_call(pid: int, until: float) -> float:
    """SIGSTOP `pid` at a moment it runs a driver's call (continuing it and trying again a few ms later
    when it does not); the wall time of the stop that stayed."""
    rng = random.Random(0)
    while time.monotonic() < until:
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        while process_state(pid) not in ("T", "t") and time.monotonic() < until:
            time.sleep(0.005)
        if "RoleHost.call (" in py_spy_stacks(pid):
            return stopped_at
        os.kill(pid, signal.SIGCONT)
        time.sleep(rng.uniform(0.0, 0.03))
    raise TimeoutError(f"pid {pid} was never seen inside a role call")


@pytest.mark.ray
@pytest.mark.slow  # a whole run on Ray (about 30 s here): the py-spy reader's own tests are in CI
def test_a_stopped_rank_is_named_in_time_with_its_stack_and_state(
    ray_cluster: None, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "data.train_batch_size=4",
            "data.builtin_train_size=64",
            "data.builtin_val_size=8",
            "data.max_response_length=8",
            "rollout.n=4",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=4",
            "actor.mixed_precision=float32",
            "algorithm.adv_estimator=grpo",
            "trainer.total_steps=200",
            f"trainer.hang_timeout_s={HANG_S}",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            "cluster.namespace=quartet-tests",
            "cluster.call_timeout_s=300",
        ],
    )
    run_dir = cfg.trainer.run_dir
    stop: dict[str, float] = {}
    failures: list[BaseException] = []

    def stopper() -> None:
        try:
            until = time.monotonic() + 240
            while not _first_step_done(run_dir) and time.monotonic() < until:
                time.sleep(0.05)
            pid = int(json.loads((run_dir / "cluster.json").read_text())["ranks"]["rl"][0]["pid"])
            stop["pid"] = pid
            stop["at"] = _stop_inside_a_call(pid, until)
        except BaseException as err:  # reported by the test thread
            failures.append(err)

    thread = threading.Thread(target=stopper, daemon=True)
    thread.start()
    caplog.set_level(logging.ERROR, logger="quartet.cluster.hostset")
    try:
        with pytest.raises(HangError) as caught:
            RLTrainer(cfg).run()
        ended = time.time()
    finally:
        thread.join(timeout=30)
        if "pid" in stop and process_state(int(stop["pid"])) is not None:
            os.kill(int(stop["pid"]), signal.SIGCONT)  # ours to undo; the run's shutdown killed the host
    assert not failures, failures
    pid = int(stop["pid"])
    named = [r for r in caplog.records if isinstance(r.msg, str) and "passed its deadline" in r.getMessage()]
    assert named, "the hang was not logged when it was named"
    named_after = named[0].created - stop["at"]
    assert named_after <= HANG_S + NAMED_MARGIN_S, f"named {named_after:.2f} s after the stop"
    assert ended - stop["at"] <= HANG_S + END_MARGIN_S, (
        f"the run ended {ended - stop['at']:.2f} s after the stop"
    )

    message = str(caught.value)
    method = re.search(r"waiting for (\w+)\(\)", message)
    assert method is not None and f"pid {pid}" in message
    assert "rank 0: stopped (SIGSTOP), " in message  # the state, then the top frame
    stacks = caught.value.stacks_file.read_text()
    rank = stacks.split("## rank 0 (SILENT)")[1]
    assert rank.splitlines()[1] == f"process state: stopped (SIGSTOP); pid {pid}"
    assert "Python stacks read by py-spy" in rank and "(no Python frame)" not in rank
    assert f".{method[1]} (" in rank and "RoleHost.call (" in rank  # the call it was stopped in
    assert "frames of Ray's actor loop below" in rank
