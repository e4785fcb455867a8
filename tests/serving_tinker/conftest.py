"""Fixtures of the Tinker SDK tests: a real `TinkerServer` on a local port over the tiny model, and the
real `tinker.ServiceClient` talking to it (one of each per test module)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

KEY = "tml-quartet-test-key"


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path) -> Iterator[tuple[str, Path]]:
    """(base URL, model folder) of a service on this process; torch on one thread while it runs (the
    service's threads and torch's pool would fight over a loaded 2-core machine)."""
    pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
    from quartet.serving.tinker.server import TinkerServer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    server = TinkerServer({"tiny": tiny_model_dir}, api_key=KEY)
    url = server.start_in_thread()
    yield url, tiny_model_dir
    server.stop_thread()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(service: tuple[str, Path]) -> Any:
    """The SDK's `ServiceClient` on `service`."""
    import tinker

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        client = tinker.ServiceClient(base_url=service[0], api_key=KEY)
    yield client
    client.close("success").result(timeout=30)  # ends its session and heartbeat thread
