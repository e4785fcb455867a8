"""Preemption: SIGTERM/SIGUSR1 to the driver saves the step it is on and exits with
`trainer.preempt_exit_code`; a second signal or the grace running out exits at once, leaving the previous
checkpoint `latest`; a step that cannot finish within the grace is abandoned at a phase boundary.

The fast tests signal this process (the handler is installed in the main thread, where pytest runs) with
the watchdog's exit replaced by a recorder, or run a short in-process run whose grace is long enough never to
fire. The slow ones run real driver processes (`quartet train`, or a script around `RLTrainer` with the
checkpoint writer's test hook) and kill them with real signals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from quartet.config import ConfigError, QuartetConfig, load_config
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.records.callbacks import Record
from quartet.trainer.recovery.checkpoint import list_checkpoints
from quartet.trainer.recovery.preemption import Preemption

COMMON = [
    "cluster.backend=local",
    "algorithm.adv_estimator=grpo",
    "data.builtin_train_size=16",
    "data.train_batch_size=4",
    "data.max_response_length=8",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=2",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-3",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.max_checkpoints_to_keep=0",
    "trainer.loggers=[jsonl]",
]
RANK_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


def _overrides(model: Path, out: Path, *extra: str) -> list[str]:
    return [*COMMON, f"model.path={model}", f"trainer.output_dir={out}", *extra]


def _config(model: Path, out: Path, *extra: str) -> QuartetConfig:
    return load_config(None, _overrides(model, out, *extra))


def _records(run_dir: Path, kind: str) -> list[dict[str, Any]]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r["kind"] == kind]


def _latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "hf" / "model.safetensors"))


# ---- the handler and the watchdog (no run) ---------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["SIGTERM", "SIGUSR1"])
def test_the_grace_ends_the_process_with_the_code_and_one_line(
    sig: signal.Signals, capfd: pytest.CaptureFixture[str]
) -> None:
    exits: list[tuple[int, float]] = []
    guard = Preemption(0.4, 75, exit_fn=lambda code: exits.append((code, time.monotonic())))
    before = signal.getsignal(sig)
    assert guard.install()
    try:
        assert not guard.requested
        sent = time.monotonic()
        os.kill(os.getpid(), sig)
        assert guard.requested and guard.signal_name == sig.name
        guard.saving_step, guard.saved_step = 4, 2
        deadline = time.monotonic() + 10
        while not exits and time.monotonic() < deadline:
            time.sleep(0.01)
        ((code, at),) = exits
        after = at - sent
        assert code == 75 and 0.4 <= after < 3.0, after  # not before the grace, and promptly after it
        assert guard.fired == "grace"
    finally:
        guard.close()
    assert signal.getsignal(sig) == before  # the previous handler is back
    line = capfd.readouterr().err.strip().splitlines()[-1]
    assert line == (
        "preemption: the grace of 0.4 s (trainer.preempt_grace_s) ran out before the checkpoint of step 4 "
        "was written: abandoned; latest is global_step_2; exiting with 75"
    )


def test_a_second_signal_ends_the_process_at_once(capfd: pytest.CaptureFixture[str]) -> None:
    exits: list[int] = []
    guard = Preemption(60.0, 99, exit_fn=exits.append)
    assert guard.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert not exits  # one signal: the grace runs
        began = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        while not exits and time.monotonic() - began < 10:
            time.sleep(0.01)
        assert exits == [99] and time.monotonic() - began < 5 and guard.fired == "second signal"
    finally:
        guard.close()
    assert "a second SIGTERM came before a step boundary was reached: nothing saved" in capfd.readouterr().err


def test_a_closed_guard_never_fires_and_grace_zero_is_off() -> None:
    # the handlers before: Python's defaults, or one an earlier test's `ray.init` left in this process
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    exits: list[int] = []
    guard = Preemption(0.2, 75, exit_fn=exits.append)
    assert guard.install()
    assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
    guard.close()  # a run that ended without a signal
    time.sleep(0.3)
    assert exits == [] and signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    assert not Preemption(0.0, 75).install()  # off: the handlers stay as they were
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_claim_takes_the_handler_back_from_one_set_later_and_close_restores_that_one() -> None:
    def later(signum: int, frame: Any) -> None:  # as `ray.init` sets one (sys.exit) after the run started
        raise AssertionError("not to be called")

    guard = Preemption(30.0, 75, exit_fn=lambda code: None)
    assert guard.install()
    try:
        signal.signal(signal.SIGTERM, later)
        guard.claim()
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested
    finally:
        guard.close()
    assert signal.getsignal(signal.SIGTERM) == later
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_step_is_let_finish_only_when_it_and_its_save_fit_the_grace_left() -> None:
    guard = Preemption(10.0, 75)
    assert guard.step_fits(elapsed_s=1.0, step_s=None, save_s=100.0)  # nothing measured: let it finish
    assert guard.step_fits(elapsed_s=1.0, step_s=5.0, save_s=6.0)  # 4 s left of the step + 6 s save
    assert not guard.step_fits(elapsed_s=1.0, step_s=5.0, save_s=6.5)
    assert guard.step_fits(elapsed_s=30.0, step_s=5.0, save_s=9.0)  # an overdue step counts as about done


def test_the_config_refuses_a_negative_grace_and_codes_that_mean_something_else() -> None:
    with pytest.raises(ConfigError, match="preempt_grace_s"):
        load_config(None, ["trainer.preempt_grace_s=-1"])
    for code in (0, 1, 2, 130):
        with pytest.raises(ConfigError, match="preempt_exit_code"):
            load_config(None, [f"trainer.preempt_exit_code={code}"])


# ---- a run in this process ------------------------------------------------------------------------------


@pytest.mark.usefixtures("one_local_rank")
def test_sigterm_during_a_run_saves_that_step_and_stops(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = _config(tiny_model_dir, tmp_path, "trainer.total_steps=4", "trainer.save_freq=0")

    def on_record(rec: Record) -> None:
        if rec["kind"] == "step" and rec["step"] == 2:  # inside step 2, before it returns to the loop
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)  # Python's default, or what an earlier `ray.init` set here
    result = RLTrainer(cfg, on_record=on_record).run()
    run_dir = result.run_dir
    assert result.preempted is not None and result.preempted.exit_code == 75
    assert result.preempted.signal == "SIGTERM" and result.steps == 2
    assert [p.name for p in list_checkpoints(run_dir)] == ["global_step_2"]
    assert _latest(run_dir) == "global_step_2"
    (rec,) = _records(run_dir, "preempt")
    assert (rec["step"], rec["signal"], rec["saved"], rec["exit_code"], rec["abandoned"]) == (
        2,
        "SIGTERM",
        True,
        75,
        "",
    )
    assert 0 < rec["save_seconds"] <= rec["since_signal_s"] < cfg.trainer.preempt_grace_s
    assert [r["step"] for r in _records(run_dir, "step")] == [1, 2]
    assert not (run_dir / "hf").exists()  # the final export is for a finished run
    assert signal.getsignal(signal.SIGTERM) == before  # the run put the handler it found back


# ---- real driver processes (slow: each imports torch and the trainer, ~10-20 s on a loaded machine) -------


def _env() -> dict[str, str]:
    env = {**os.environ, **RANK_ENV, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


def _quartet() -> list[str]:
    script = Path(sys.executable).parent / "quartet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "quartet.cli.main"]


def _wait_for_step(run_dir: Path, proc: subprocess.Popen[str], step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        if any(json.loads(x).get("kind") == "step" and json.loads(x)["step"] >= step for x in lines if x):
            return
        time.sleep(0.02)
    raise AssertionError(f"no step {step} within {timeout_s} s")


STEPS = 30  # ~60 ms each on the tiny model: the signal lands mid-run, the run resumes to its end


# SIGTERM's run is CI's preemption test (~20 s: a real `quartet train`, signalled, resumed); SIGUSR1 takes the
# same path from the handler on, so it runs with the slow tests
@pytest.mark.usefixtures("one_local_rank")
@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGUSR1, marks=pytest.mark.slow)],
    ids=["SIGTERM", "SIGUSR1"],
)
def test_quartet_train_preempted_mid_run_exits_75_and_resumes_equal_to_a_straight_run(
    tiny_model_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    extra = (f"trainer.total_steps={STEPS}", "trainer.save_freq=0")
    straight = RLTrainer(_config(tiny_model_dir, tmp_path / "straight", *extra)).run()
    assert straight.steps == STEPS
    out = tmp_path / "preempted"
    run_dir = out / "quartet" / "demo"
    command = [*_quartet(), "train", *_overrides(tiny_model_dir, out, *extra)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    _wait_for_step(run_dir, proc, 2, timeout_s=240)
    sent = time.monotonic()
    proc.send_signal(sig)
    log, _ = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 75, log[-3000:]
    assert took < 60, took  # the default grace is 120 s; the tiny run needs well under a second
    (rec,) = _records(run_dir, "preempt")
    steps = [r["step"] for r in _records(run_dir, "step")]
    assert rec["signal"] == sig.name and rec["saved"] and rec["abandoned"] == ""
    assert rec["step"] == steps[-1] < STEPS and steps == list(range(1, rec["step"] + 1))  # the step it was on
    assert _latest(run_dir) == f"global_step_{rec['step']}"
    assert [p.name for p in list_checkpoints(run_dir)] == [f"global_step_{rec['step']}"]
    assert f"preemption: {sig.name} received" in log and "exiting with 75" in log
    assert f"preempted by {sig.name}: {run_dir} holds step {rec['step']}; exit 75" in log
    resumed = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=240)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resumed after step {rec['step']}" in resumed.stdout
    diff = [k for k, v in _params(straight.run_dir).items() if not torch.equal(v, _params(run_dir)[k])]
    assert diff == []  # bit for bit
    scores = {r["step"]: r["critic/score/mean"] for r in _records(run_dir, "step")}
    assert scores == {r["step"]: r["critic/score/mean"] for r in _records(straight.run_dir, "step")}


SLOW_SAVE = textwrap.dedent(
    """
    import os, signal, sys, time
    from quartet.config import load_config
    from quartet.trainer.records.callbacks import RunCallbacks
    from quartet.trainer.loop.rl_trainer import RLTrainer

    MODE = sys.argv[1]

    class SignalThenSlowSave(RunCallbacks):
        def on_record(self, record):
            if record["kind"] == "step" and record["step"] == 3:
                print("signal at", time.time(), flush=True)
                os.kill(os.getpid(), signal.SIGTERM)

        def after_roles_saved(self, tmp):  # the checkpoint writer's test hook: roles written, state not
            if tmp.name.endswith("global_step_3"):
                if MODE == "second":
                    os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(200)

    RLTrainer(load_config(None, sys.argv[2:]), callbacks=SignalThenSlowSave()).run()
    print("returned", flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["grace", "second"])
def test_a_save_past_the_grace_or_a_second_sigterm_leaves_the_previous_checkpoint_latest(
    tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    grace = 3.0
    overrides = _overrides(
        tiny_model_dir,
        tmp_path,
        "trainer.total_steps=6",
        "trainer.save_freq=2",
        f"trainer.preempt_grace_s={grace}",
    )
    done = subprocess.run(
        [sys.executable, "-c", SLOW_SAVE, mode, *overrides],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=240,
    )
    ended = time.time()
    assert done.returncode == 75, done.stdout[-2000:] + done.stderr[-3000:]
    assert "returned" not in done.stdout  # ended by the watchdog, in the save
    signalled = float(next(x for x in done.stdout.splitlines() if x.startswith("signal at")).split()[-1])
    if mode == "grace":
        assert grace <= ended - signalled < grace + 10
        cause = f"the grace of {grace:g} s (trainer.preempt_grace_s) ran out"
    else:
        assert ended - signalled < grace + 10
        cause = "a second SIGTERM came"
    line = (
        f"preemption: {cause} before the checkpoint of step 3 was written: abandoned; latest is global_step_2"
    )
    assert f"{line}; exiting with 75" in done.stderr
    run_dir = tmp_path / "quartet" / "demo"
    assert _latest(run_dir) == "global_step_2"
    assert [p.name for p in list_checkpoints(run_dir)] == ["global_step_2"]
    assert (run_dir / "checkpoints" / ".tmp-global_step_3" / "actor").is_dir()  # cut short mid-write


ABANDON = textwrap.dedent(
    """
    import os, signal, sys, time
    from quartet.config import load_config
    from quartet.trainer.loop.rl_trainer import RLTrainer
    from quartet.trainer.loop.step import StepRunner

    original = StepRunner._advantages
    calls = [0]

    def advantages(self, batch):  # step 2 takes ~6 s; step 3 is signalled before its update
        calls[0] += 1
        if calls[0] == 2:
            time.sleep(6)
        if calls[0] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, batch)

    StepRunner._advantages = advantages
    result = RLTrainer(load_config(None, sys.argv[1:])).run()
    print("returned", result.steps, result.preempted, flush=True)
    """
)


@pytest.mark.slow
def test_a_step_that_cannot_finish_within_the_grace_is_abandoned_before_its_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    overrides = _overrides(
        tiny_model_dir, tmp_path, "trainer.total_steps=6", "trainer.save_freq=0", "trainer.preempt_grace_s=3"
    )
    done = subprocess.run(
        [sys.executable, "-c", ABANDON, *overrides], capture_output=True, text=True, env=_env(), timeout=240
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]  # a script: run() returned
    assert "returned 2 PreemptionNotice(signal='SIGTERM', grace_s=3.0, exit_code=75)" in done.stdout
    run_dir = tmp_path / "quartet" / "demo"
    (rec,) = _records(run_dir, "preempt")
    assert rec["step"] == 2 and rec["saved"]
    assert rec["abandoned"] == "step 3 at phase 'update_actor'"
    assert [r["step"] for r in _records(run_dir, "step")] == [1, 2]
    assert _latest(run_dir) == "global_step_2"
