"""A run's local Ray leaves with its driver, agents included, even when the driver is SIGKILLed (Ray 2.60's
dashboard and runtime-env agents otherwise outlive it by ~62 s: `quartet.cluster.reaper`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from quartet.cluster.reaper import session_pids

DRIVER = """
import ray
from quartet.cluster.runtime import connect
from quartet.config.cluster import ClusterConfig

connect(ClusterConfig(namespace="reaper-test", num_cpus=1))
print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
import time
time.sleep(600)
"""


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watcher reads /proc")
def test_a_sigkilled_driver_leaves_no_ray_agent_behind() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private Ray, as a run starts it
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    tree: list[psutil.Process] = []
    try:
        assert driver.stdout is not None
        session = driver.stdout.readline().strip()
        assert Path(session).is_dir(), session
        agents: list[psutil.Process] = []
        for _ in range(300):  # the raylet starts its two agents a moment after ray.init returns
            tree = psutil.Process(driver.pid).children(recursive=True)
            agents = [p for p in tree if p.name() in ("ray::DashboardAgent", "ray::RuntimeEnvAgent")]
            if len(agents) == 2:
                break
            time.sleep(0.1)
        assert len(agents) == 2, [p.name() for p in tree]
        (watcher,) = [p for p in tree if "reaper.py" in " ".join(p.cmdline())]
        assert len(session_pids(session, watcher.pid)) >= 3  # gcs, raylet, dashboard, ...
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait(timeout=60)
        watcher.wait(timeout=120)  # it returns once it has ended the session's processes
        left = [p for p in tree if not _gone(p) and p.pid != watcher.pid]
        assert not left, [(p.pid, p.name()) for p in left]
    finally:
        for proc in [*tree, psutil.Process(driver.pid) if driver.poll() is None else None]:
            if proc is not None and not _gone(proc):
                proc.kill()  # only this test's own processes


SHUTDOWN_DRIVER = """
import ray
from quartet.cluster.runtime import connect
from quartet.config.cluster import ClusterConfig
import quartet.cluster.reaper as reaper

connect(ClusterConfig(namespace="reaper-test", num_cpus=1))
(watcher,) = reaper._watchers
ray.shutdown()
print("exited with", watcher.wait(timeout=120), flush=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the watcher reads /proc")
def test_the_watcher_stops_after_a_normal_shutdown_while_the_driver_lives() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_DRIVER], capture_output=True, text=True, timeout=300, env=env
    )
    assert "exited with 0" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
