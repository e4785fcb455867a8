"""`quartet doctor --run-dir` from another process reaches a run's token-authenticated local Ray (Ray 2.60
turns token auth on for a `ray.init()` cluster; a process joining by explicit address did not send the
token and was told "no Ray cluster"), and names a refused token as such."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import roles_for_tests
from ray import cloudpickle
from roles_for_tests import Counter

from quartet.cluster.auth import enable_token_auth, token_source
from quartet.cluster.colocate import RoleSpec, colocate
from quartet.cluster.naming import RunNames
from quartet.cluster.pool import ResourcePool

cloudpickle.register_pickle_by_value(roles_for_tests)
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")


def _doctor_from_a_shell(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The doctor as a user's shell starts it: none of the variables Ray set in this (the run's) process."""
    clean = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    return subprocess.run(
        [sys.executable, "-m", "quartet.cli.main", "doctor", "--no-smoke", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env={**clean, "COLUMNS": "200", **env},
    )


def _token_auth_on() -> None:
    if os.environ.get("RAY_AUTH_MODE") != "token":
        pytest.skip("the session's Ray runs without token authentication (RAY_AUTH_MODE is set otherwise)")


@pytest.mark.ray
def test_doctor_reaches_a_token_auth_run_from_another_process(ray_cluster: None, tmp_path: Path) -> None:
    import ray

    _token_auth_on()
    names = RunNames("quartet-tests", "auth-run", ray.get_runtime_context().gcs_address)
    hosts = colocate(
        ResourcePool(1, 1, 0.5, use_gpu=False, timeout_s=30).create(), names, counter=RoleSpec(Counter, 0)
    )
    try:
        hosts.health()
        names.save(tmp_path)  # cluster.json, as the trainer writes it
        done = _doctor_from_a_shell("--run-dir", str(tmp_path))
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "No Ray cluster" not in done.stdout and "auth-run" in done.stdout
        assert "discovery ok" in done.stdout and "1/1 workers" in done.stdout
        assert "InvalidAuthToken" not in done.stderr  # no retry warnings either
    finally:
        hosts.shutdown()


@pytest.mark.ray
def test_doctor_names_a_refused_token_not_a_missing_cluster(ray_cluster: None) -> None:
    import ray

    _token_auth_on()
    address = ray.get_runtime_context().gcs_address
    done = _doctor_from_a_shell(
        "--address", address, "--no-probe", RAY_AUTH_TOKEN="not-the-token-" + "0" * 20
    )
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout.replace("\n", " ")
    assert f"the Ray cluster at '{address}' is running but refused this process's authentication token" in out
    assert "RAY_AUTH_TOKEN variable" in out and "No Ray cluster" not in out
    assert "fix: run `quartet doctor` as the user that started the run" in out
    assert "ray start --head" not in out


def test_token_auth_is_enabled_only_with_a_token_and_no_explicit_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in AUTH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    assert token_source() is None and not enable_token_auth() and "RAY_AUTH_MODE" not in os.environ
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("t" * 32)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert token_source() == str(token) and not enable_token_auth()  # an explicit mode is respected
    monkeypatch.delenv("RAY_AUTH_MODE")
    assert enable_token_auth() and os.environ["RAY_AUTH_MODE"] == "token"
