"""Forming a weight-sync group: config checks, bounded joins with clear messages, and no use of
torch.distributed's global state. Ranks are threads of this process; the groups are real gloo groups."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.distributed as dist
from weight_sync_workers import HOST

from quartet.config.errors import ConfigError
from quartet.weight_sync import (
    BackendUnavailableError,
    GroupConfig,
    GroupJoinError,
    SyncBackend,
    WeightReceiver,
    WeightSender,
    connect,
    create_group,
    listen,
)

pytestmark = pytest.mark.timeout(60)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"world_size": 1}, "world_size"),
        ({"port": -1}, "port"),
        ({"port": 70000}, "port"),
        ({"timeout_s": 0}, "timeout_s"),
        ({"host": ""}, "host"),
        ({"backend": "mpi"}, "backend"),
    ],
)
def test_config_rejects_impossible_values(kwargs: dict[str, object], field: str) -> None:
    values: dict[str, object] = {"host": HOST, "port": 0, "world_size": 2, **kwargs}
    with pytest.raises(ConfigError, match=f"^{field}:"):
        GroupConfig(**values)  # type: ignore[arg-type]


def test_config_accepts_the_backend_by_name() -> None:
    config = GroupConfig(HOST, 0, 2, backend="nccl")  # type: ignore[arg-type]
    assert config.backend is SyncBackend.NCCL


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_nccl_is_refused_clearly_on_a_cpu_machine() -> None:
    config = GroupConfig(HOST, 0, 2, backend=SyncBackend.NCCL)
    with pytest.raises(BackendUnavailableError, match="nccl.*Use backend='gloo'"):
        listen(config)
    with pytest.raises(BackendUnavailableError, match="nccl"):
        connect(config, 1)


def test_a_group_forms_without_any_global_process_group() -> None:
    port = free_port()
    config = GroupConfig(HOST, port, 2, timeout_s=20)
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(create_group, config, 1)  # may start before rank 0 listens: it retries
        sender_group = create_group(config, 0)
        receiver_group = joining.result(timeout=30)
    with sender_group, receiver_group:
        assert (sender_group.rank, receiver_group.rank, sender_group.world_size) == (0, 1, 2)
        assert sender_group.device == torch.device("cpu")
        assert not dist.is_initialized()  # no default group was created or needed
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(WeightReceiver(receiver_group).receive_all, 20.0)
            WeightSender(sender_group).send([("w", torch.arange(4.0))], version=1)
            assert torch.equal(future.result(timeout=30).tensors[0][1], torch.arange(4.0))


def test_a_missing_receiver_fails_the_join_naming_address_world_size_and_missing_ranks() -> None:
    listener = listen(GroupConfig(HOST, 0, 3, timeout_s=1.0))
    config = GroupConfig(HOST, listener.port, 3, timeout_s=1.0)
    start = time.monotonic()
    with ThreadPoolExecutor(1) as pool:
        present = pool.submit(connect, config, 1)  # rank 2 never comes
        with pytest.raises(GroupJoinError) as sender_err:
            listener.accept()
        with pytest.raises(GroupJoinError) as receiver_err:
            present.result(timeout=30)
    assert time.monotonic() - start < 10
    message = str(sender_err.value)
    assert f"{HOST}:{listener.port}" in message and "2 of 3 ranks joined" in message
    assert "missing ranks [2]" in message
    assert (sender_err.value.world_size, sender_err.value.joined) == (3, 2)
    assert "missing ranks [2]" in str(receiver_err.value)


def test_an_unreachable_sender_fails_the_join_naming_its_address() -> None:
    port = free_port()  # nobody listens there
    start = time.monotonic()
    with pytest.raises(GroupJoinError, match=f"{HOST}:{port} \\(world size 2\\).*could not reach") as err:
        connect(GroupConfig(HOST, port, 2, timeout_s=1.0), 1)
    assert time.monotonic() - start < 10  # torch retries once inside its timeout
    assert err.value.joined == -1


def test_a_busy_port_and_a_bad_rank_are_refused() -> None:
    listener = listen(GroupConfig(HOST, 0, 2, timeout_s=1.0))
    with pytest.raises(GroupJoinError, match="cannot listen"):
        listen(GroupConfig(HOST, listener.port, 2, timeout_s=1.0))
    for rank in (0, 2):
        with pytest.raises(ValueError, match="receiver's rank is 1..1"):
            connect(GroupConfig(HOST, listener.port, 2, timeout_s=1.0), rank)
