"""The Tinker service holds under pressure: 429 beyond a client's queue bound (others unharmed), 410 for
results nobody fetched in time, a graceful stop, and a CONFIG file whose mistakes name the key."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")

from quartet.config.errors import ConfigError  # noqa: E402
from quartet.serving.tinker.server import TinkerServer  # noqa: E402
from quartet.serving.tinker.service_config import TinkerServiceConfig, load_service_config  # noqa: E402

KEY = "tml-limits"


def _post(url: str, call: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/{call}", json=body, headers={"X-API-Key": KEY}, timeout=30)


def _result(url: str, reply: httpx.Response) -> dict[str, Any]:
    assert reply.status_code == 200, reply.text
    request_id = reply.json()["request_id"]
    for _ in range(60):
        answer = _post(url, "retrieve_future", {"request_id": request_id})
        if answer.status_code != 200 or answer.json().get("type") != "try_again":
            return {"status": answer.status_code, **answer.json()}
    raise AssertionError("no answer in 60 polls")


def _create(url: str) -> str:
    body = {"base_model": "tiny", "lora_config": {"rank": 2}}
    return str(_result(url, _post(url, "create_model", body))["model_id"])


def _optim(url: str, model_id: str) -> httpx.Response:
    return _post(url, "optim_step", {"model_id": model_id, "adam_params": {"learning_rate": 0.0}})


@pytest.fixture
def limited(tiny_model_dir: Path) -> Iterator[TinkerServer]:
    config = TinkerServiceConfig(
        models={"tiny": str(tiny_model_dir)}, max_queued_per_model=2, result_ttl_s=0.5
    )
    server = TinkerServer(config.models, KEY, config=config)
    server.start_in_thread()
    yield server
    server.stop_thread(grace_s=5)


def _hold(server: TinkerServer) -> threading.Event:
    """Occupy the base's one thread until the event is set (a stand-in for a slow request)."""
    gate = threading.Event()
    server.state.hosts["tiny"].queues.submit("someone-slow", lambda: gate.wait(30))
    return gate


def test_beyond_its_queue_bound_a_client_gets_429_and_another_is_served(limited: TinkerServer) -> None:
    url = str(limited.url)
    greedy, polite = _create(url), _create(url)
    gate = _hold(limited)
    accepted = [_optim(url, greedy), _optim(url, greedy)]
    refused = _optim(url, greedy)
    assert refused.status_code == 429, refused.text
    assert refused.headers["Retry-After"].isdigit()
    assert "max_queued_per_model" in refused.json()["error"]["message"]
    other = _optim(url, polite)
    gate.set()
    assert all(_result(url, r)["status"] == 200 for r in accepted)
    assert _result(url, other) == {"status": 200, "metrics": {"grad_norm:mean": 0.0}}


def test_a_result_nobody_fetches_expires_with_410(limited: TinkerServer) -> None:
    url = str(limited.url)
    model_id = _create(url)
    reply = _optim(url, model_id)
    request_id = reply.json()["request_id"]
    time.sleep(1.0)  # result_ttl_s is 0.5
    gone = _post(url, "retrieve_future", {"request_id": request_id})
    assert gone.status_code == 410, gone.text
    assert limited.state.unfetched == 0


def test_stop_finishes_the_running_call_cancels_the_queued_and_refuses_new(tiny_model_dir: Path) -> None:
    server = TinkerServer({"tiny": tiny_model_dir}, KEY)
    url = server.start_in_thread()
    model_id = _create(url)
    gate = _hold(server)
    running = server.state.hosts["tiny"].queues.submit(model_id, lambda: time.sleep(1.5) or "done")
    queued = _optim(url, model_id)
    stopper = threading.Thread(target=server.stop_thread, kwargs={"grace_s": 10})
    gate.set()
    deadline = time.monotonic() + 30
    while not running.running() and time.monotonic() < deadline:  # it must run before the stop begins
        time.sleep(0.01)
    stopper.start()
    time.sleep(0.5)  # the running call has 1 s to go: the service is stopping, still listening
    refused = _optim(url, model_id)
    stopper.join(30)
    assert running.result(timeout=1) == "done"
    assert refused.status_code == 503, refused.text
    queued_id = queued.json()["request_id"]
    assert server.state.pending(queued_id).cancelled()


def test_a_config_file_is_read_and_its_mistakes_name_the_key(tmp_path: Path, tiny_model_dir: Path) -> None:
    good = tmp_path / "tinker.yaml"
    good.write_text(f"models:\n  tiny: {tiny_model_dir}\nport: 0\nmax_num_samples: 8\n")
    config = load_service_config(good, state_dir=str(tmp_path / "state"))
    assert (config.models, config.port, config.max_num_samples) == ({"tiny": str(tiny_model_dir)}, 0, 8)
    assert config.state_dir == str(tmp_path / "state")
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"models:\n  tiny: {tiny_model_dir}\nmax_queue: 3\n")
    with pytest.raises(ConfigError, match="max_queue") as err:
        load_service_config(typo)
    assert "typo.yaml" in str(err.value)
    with pytest.raises(ConfigError, match="models.tiny"):
        TinkerServiceConfig(models={"tiny": str(tmp_path / "absent")})
    with pytest.raises(ConfigError, match="QUARTET_TEST_ABSENT_KEY"):
        TinkerServiceConfig(
            models={"tiny": str(tiny_model_dir)}, api_key_env="QUARTET_TEST_ABSENT_KEY"
        ).api_key()


def test_a_silent_session_ends_and_its_models_are_unloaded(tiny_model_dir: Path) -> None:
    """A client that died (no heartbeat for session_ttl_s) leaves no adapter and no queue behind."""
    config = TinkerServiceConfig(models={"tiny": str(tiny_model_dir)}, session_ttl_s=0.4)
    server = TinkerServer(config.models, KEY, config=config)
    url = server.start_in_thread()
    try:
        session = _post(url, "create_session", {"tags": []}).json()["session_id"]
        body = {"session_id": session, "base_model": "tiny", "lora_config": {"rank": 2}}
        model_id = _result(url, _post(url, "create_model", body))["model_id"]
        assert _post(url, "session_heartbeat", {"session_id": session}).status_code == 200
        time.sleep(0.6)
        assert _post(url, "session_heartbeat", {"session_id": session}).status_code == 410
        assert _optim(url, model_id).status_code == 404
        barrier = server.state.hosts["tiny"].queues.submit("check", lambda: None)
        barrier.result(timeout=30)  # the unload queued before it has run
        assert model_id not in server.state.hosts["tiny"].host.call(lambda h: h.names)
    finally:
        server.stop_thread(grace_s=5)
