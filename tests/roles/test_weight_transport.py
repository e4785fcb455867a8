"""Which transport a weight sync takes (`rollout.weight_sync.transport`): the actor's choice per sync and
the driver's same-node check, without Ray (the transports themselves: tests/weight_sync)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from quartet.config import load_config
from quartet.config.errors import ConfigError
from quartet.config.rollout import WeightTransport
from quartet.roles.weight_stream import choose_transport
from quartet.trainer.workers.weight_sync import StreamSync
from quartet.weight_sync import SyncTransport

A, G, C, S = WeightTransport.AUTO, WeightTransport.GLOO, WeightTransport.CUDA_IPC, WeightTransport.SHM


@pytest.mark.parametrize(
    ("setting", "same_node", "on_cuda", "expected"),
    [
        (A, True, True, SyncTransport.CUDA_IPC),  # the only case auto leaves gloo for
        (A, True, False, SyncTransport.BROADCAST),  # weights on the host: nothing to hand over by IPC
        (A, False, True, SyncTransport.BROADCAST),  # a replica on another node
        (G, True, True, SyncTransport.BROADCAST),
        (S, True, False, SyncTransport.SHM),
        (S, True, True, SyncTransport.SHM),
    ],
)
def test_the_transport_follows_the_setting_the_nodes_and_the_device(
    setting: WeightTransport, same_node: bool, on_cuda: bool, expected: SyncTransport
) -> None:
    assert choose_transport(setting, same_node, on_cuda) is expected


def test_auto_keeps_gloo_when_a_replica_does_not_see_the_actors_gpu() -> None:
    assert choose_transport(A, same_node=True, on_cuda=True, gpu_shared=False) is SyncTransport.BROADCAST


def test_same_node_transports_are_refused_across_nodes_and_cuda_ipc_without_cuda() -> None:
    for setting in (C, S):
        with pytest.raises(ValueError, match=f"transport={setting.value} needs every rollout replica"):
            choose_transport(setting, same_node=False, on_cuda=True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_ipc needs CUDA"):
            choose_transport(C, same_node=True, on_cuda=False)


def _stream(ips: list[str], transport: WeightTransport) -> StreamSync:
    hosts: Any = SimpleNamespace(nodes=[{"ip": ip} for ip in ips], pool=None)
    rollout: Any = SimpleNamespace(world_size=len(ips))
    return StreamSync(actor=None, rollout=rollout, rollout_hosts=hosts, timeout_s=5.0, transport=transport)  # type: ignore[arg-type]


def test_the_driver_compares_every_replicas_node_with_the_actors() -> None:
    assert _stream(["10.0.0.1", "10.0.0.1"], A)._all_on_node("10.0.0.1") is True
    assert _stream(["10.0.0.1", "10.0.0.2"], A)._all_on_node("10.0.0.1") is False
    with pytest.raises(ValueError, match=r"transport=cuda_ipc needs .* node 10.0.0.1.*10.0.0.2"):
        _stream(["10.0.0.1", "10.0.0.2"], C)._all_on_node("10.0.0.1")
    unknown: Any = SimpleNamespace(nodes=[], pool=None)  # no node facts: never assumed to be the same node
    stream = _stream(["10.0.0.1"], A)
    stream.rollout_hosts = unknown
    assert stream._all_on_node("10.0.0.1") is False


def test_the_config_key_takes_the_four_values_and_names_the_choices_otherwise() -> None:
    for value in ("auto", "gloo", "cuda_ipc", "shm"):
        cfg = load_config(None, [f"rollout.weight_sync.transport={value}"], check=False)
        assert cfg.rollout.weight_sync.transport is WeightTransport(value)
    assert load_config(None, [], check=False).rollout.weight_sync.transport is A
    with pytest.raises(ConfigError, match="transport"):
        load_config(None, ["rollout.weight_sync.transport=nccl"], check=False)
