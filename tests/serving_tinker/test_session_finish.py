"""The SDK's session end (`ServiceClient.close()`, the exit of `with ServiceClient(...)`): the cookbook's
recipes hold their client in a `with` block, so a service that does not answer it fails every recipe at
its last line (issue 51)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")

from quartet.serving.tinker.server import TinkerServer  # noqa: E402

KEY = "tml-quartet-finish-key"


@pytest.fixture(scope="module")
def url(tiny_model_dir: Path) -> Iterator[str]:
    server = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY)
    yield server.start_in_thread()
    server.stop_thread()


def test_leaving_the_with_block_ends_the_session(url: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with tinker.ServiceClient(base_url=url, api_key=KEY) as client:
            session_id = client.holder.get_session_id()
            assert [m.model_name for m in client.get_server_capabilities().supported_models] == ["tiny"]
    # ended: its heartbeat and a second end are refused, naming the session
    headers = {"X-API-Key": KEY}
    beat = httpx.post(f"{url}/api/v1/session_heartbeat", json={"session_id": session_id}, headers=headers)
    again = httpx.post(f"{url}/api/v1/sessions/{session_id}/finish", json={}, headers=headers)
    assert (beat.status_code, again.status_code) == (404, 404)
    assert again.json()["error"]["param"] == "session_id"


def test_ending_an_unknown_session_is_404_and_needs_the_key(url: str) -> None:
    finish = f"{url}/api/v1/sessions/session-nope/finish"
    assert httpx.post(finish, json={}, headers={"X-API-Key": KEY}).status_code == 404
    assert httpx.post(finish, json={}, headers={"X-API-Key": "tml-wrong"}).status_code == 401
    assert httpx.post(finish, content=b"{", headers={"X-API-Key": KEY}).status_code == 400
