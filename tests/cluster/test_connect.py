"""What `cluster.address` means (`resolve_target`), and the messages of a join that cannot work.

No Ray is joined here: the environment lookup reads `RAY_ADDRESS` and Ray's `ray start` record under
`RAY_TMPDIR` (pointed at a temp folder), and every bad address is refused by the checks before `ray.init`.
The joins themselves, with a real `ray start` cluster, are in `test_ray_start_cluster.py` (slow).
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from quartet.cluster.connect import RayConnectError, check_listening, join_bounded, resolve_target, target_of


@pytest.fixture
def no_cluster_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No RAY_ADDRESS, and Ray's temp dir (where `ray start` records its address) in a fresh folder."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    return tmp_path / "ray" / "ray_current_cluster"


@pytest.fixture
def listening() -> Iterator[str]:
    """`127.0.0.1:port` of a TCP listener that accepts and says nothing (a live `ray start` stand-in)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def http_server() -> Iterator[str]:
    """An HTTP/1 server: something listens, but it is not a Ray GCS."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return f"127.0.0.1:{port}"


def test_empty_address_starts_a_local_ray_when_nothing_points_at_a_cluster(no_cluster_env: Path) -> None:
    target = resolve_target("")
    assert target.mode == "start" and target.address is None
    assert "RAY_ADDRESS is not set" in target.source


def test_empty_address_joins_ray_address(no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    target = resolve_target("")
    assert (target.mode, target.address) == ("join", "10.1.2.3:6379")
    assert "RAY_ADDRESS" in target.source and "ray job submit" in target.source
    assert resolve_target("auto").address == "10.1.2.3:6379"


def test_explicit_and_local_addresses_win_over_the_environment(
    no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")
    assert resolve_target("10.9.9.9:7000").address == "10.9.9.9:7000"
    local = resolve_target("local")
    assert local.mode == "start" and local.source == "cluster.address=local"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert resolve_target("").mode == "start"


def test_a_dashboard_url_in_ray_address_is_explained(
    no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    with pytest.raises(RayConnectError, match=r"Ray Jobs \(dashboard\) address") as err:
        resolve_target("")
    assert "ray job submit -- quartet train" in str(err.value)


def test_a_live_ray_start_record_is_joined(no_cluster_env: Path, listening: str) -> None:
    no_cluster_env.write_text(listening)
    target = resolve_target("")
    assert (target.mode, target.address) == ("join", listening)
    assert str(no_cluster_env) in target.source


def test_a_stale_ray_start_record_is_ignored_with_a_warning(
    no_cluster_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = closed_port()
    no_cluster_env.write_text(stale)
    with caplog.at_level("WARNING", logger="quartet.cluster.connect"):
        target = resolve_target("", connect_timeout_s=2.0)
    assert target.mode == "start"
    assert any(stale in r.getMessage() and "is gone" in r.getMessage() for r in caplog.records)


def test_auto_without_any_cluster_fails_with_the_fix(
    no_cluster_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("quartet.cluster.connect._running_gcs", lambda: [])
    with pytest.raises(RayConnectError, match="no running Ray cluster was found") as err:
        resolve_target("auto")
    assert "ray start --head" in str(err.value)
    monkeypatch.setattr("quartet.cluster.connect._running_gcs", lambda: ["10.0.0.1:1", "10.0.0.2:2"])
    with pytest.raises(RayConnectError, match="2 Ray clusters run on this machine"):
        resolve_target("auto")


def test_nothing_listening_is_named_at_once() -> None:
    address = closed_port()
    with pytest.raises(RayConnectError) as err:
        check_listening(address, "cluster.address", timeout_s=5.0)
    message = str(err.value)
    assert address in message and "from cluster.address" in message
    assert "nothing is listening there" in message and "ray start --head" in message


def test_a_listener_that_is_not_ray_is_named(http_server: str) -> None:
    with pytest.raises(RayConnectError, match="did not answer as a Ray GCS") as err:
        check_listening(http_server, "cluster.address", timeout_s=2.0)
    assert "not the dashboard (8265)" in str(err.value)


def test_a_malformed_address_is_named() -> None:
    with pytest.raises(RayConnectError, match="not an address"):
        check_listening("my-cluster", "cluster.address", timeout_s=1.0)


def test_join_bounded_refuses_before_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong address never reaches `ray.init` (whose own retries took minutes): the check refuses it."""
    called: list[str] = []
    monkeypatch.setattr("quartet.cluster.connect.join", lambda *a, **k: called.append("init"))
    address = closed_port()
    with pytest.raises(RayConnectError, match="nothing is listening"):
        join_bounded(target_of(address, "find_workers(address=...)"), "ns", timeout_s=5.0)
    assert called == []


def test_version_mismatch_is_explained(monkeypatch: pytest.MonkeyPatch, listening: str) -> None:
    def mismatch(*args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "Version mismatch: The cluster was started with:\n    Ray: 2.40.0\n    Python: 3.10.12\n"
            "This process on node 10.0.0.1 was started with:\n    Ray: 2.60.0\n    Python: 3.11.9"
        )

    monkeypatch.setattr("quartet.cluster.connect.join", mismatch)
    monkeypatch.setattr("quartet.cluster.connect._speaks_grpc", lambda address, timeout_s: True)
    with pytest.raises(RayConnectError, match="Ray or Python versions differ") as err:
        join_bounded(target_of(listening, "cluster.address"), "ns", timeout_s=5.0)
    assert listening in str(err.value) and "same Python minor version" in str(err.value)
