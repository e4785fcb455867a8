"""Following a cluster's Ray authentication mode (`quartet.cluster.auth`) without a Ray: a stand-in GCS
(an in-process gRPC server) that refuses or answers a call without a token, and the mode decisions.

The join of a real `ray start` cluster without token authentication is in `test_ray_start_cluster.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc  # type: ignore[import-untyped]  # Ray's dependency; no stubs installed
import pytest

from quartet.cluster import auth
from quartet.cluster.auth import ClusterAuthError, cluster_requires_token, match_cluster_auth

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _stand_in_gcs(requires_token: bool) -> tuple[grpc.Server, str]:
    def cluster_id(request: bytes, context: grpc.ServicerContext) -> bytes:
        if requires_token and not any(k == "authorization" for k, _ in context.invocation_metadata()):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: token is missing")
        return b""

    handler = grpc.method_handlers_generic_handler(
        "ray.rpc.NodeInfoGcsService", {"GetClusterId": grpc.unary_unary_rpc_method_handler(cluster_id)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture(params=[True, False], ids=["token", "no-auth"])
def gcs(request: pytest.FixtureRequest) -> Iterator[tuple[str, bool]]:
    server, address = _stand_in_gcs(request.param)
    try:
        yield address, request.param
    finally:
        server.stop(grace=None)


@pytest.fixture
def clean_auth_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """No auth variables, a HOME with a token file, and mode changes recorded instead of applied (Ray's
    cached config of this test process stays as it was)."""
    for var in AUTH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t" * 32)
    monkeypatch.setitem(auth._MODE_SET_HERE, "mode", None)
    applied: list[str] = []
    monkeypatch.setattr(auth, "_set_mode", applied.append)
    return applied


def test_the_cluster_is_asked_whether_it_requires_a_token(gcs: tuple[str, bool]) -> None:
    address, requires = gcs
    assert cluster_requires_token(address, timeout_s=5.0) is requires


def test_an_address_that_cannot_be_asked_gives_no_answer() -> None:
    assert cluster_requires_token("ray://127.0.0.1:10001") is None
    other = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # gRPC, but not a Ray GCS
    port = other.add_insecure_port("127.0.0.1:0")
    other.start()
    try:
        assert cluster_requires_token(f"127.0.0.1:{port}", timeout_s=5.0) is None
    finally:
        other.stop(grace=None)


def test_the_mode_follows_the_cluster_whatever_token_file_this_machine_has(clean_auth_env: list[str]) -> None:
    assert match_cluster_auth("h:1", requires=False) is False
    assert match_cluster_auth("h:1", requires=True) is True
    assert clean_auth_env == ["disabled", "token"]
    assert match_cluster_auth("h:1", requires=None) is True  # cannot be asked: a token file means token


def test_an_explicit_mode_that_contradicts_the_cluster_is_named_with_the_fix(
    clean_auth_env: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(ClusterAuthError, match="runs without token authentication, but this process has "):
        match_cluster_auth("h:1", requires=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ClusterAuthError, match="has token authentication on, but this process has ") as err:
        match_cluster_auth("h:1", requires=True)
    assert "unset RAY_AUTH_MODE" in err.value.fix and clean_auth_env == []
    monkeypatch.setitem(auth._MODE_SET_HERE, "mode", "disabled")  # set by an earlier join, not the user
    assert match_cluster_auth("h:1", requires=True) is True


def test_a_cluster_that_requires_a_token_this_machine_lacks_is_named(
    clean_auth_env: list[str], tmp_path: Path
) -> None:
    (tmp_path / ".ray" / "auth_token").unlink()
    with pytest.raises(ClusterAuthError, match="has token authentication on, but this process has no token"):
        match_cluster_auth("h:1", requires=True)
