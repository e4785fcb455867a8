"""Where a base model's `AdapterHost` lives: in the service's process (`backend: local`) or in a Ray actor
of its own (`backend: ray`), one per base model, with `gpus_per_base` GPUs.

Both answer `call(fn)`: run `fn(host)` where the host is and return its result. The service's per-base
thread (`queues.FairQueues`) makes the call, so the order and turn-taking are the same either way; on Ray
`fn` travels by cloudpickle (it must only close over plain data: a decoded request, a model id) and its
result comes back the same way, within `call_timeout_s` (else the call fails naming the key).

On Ray, the service joins the cluster `ray_address` names (empty: the one this environment points at, or a
local one; `quartet.cluster.ray_session.connect`) in `ray_namespace`. A host actor that dies (OOM, a
killed node) fails its base's calls with an error naming the base and the cause; the other bases and
the service stay up.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from quartet.serving.tinker.adapters import AdapterHost

__all__ = ["HostError", "HostHandle", "LocalHost", "RayHost", "start_host"]

T = TypeVar("T")


class HostError(RuntimeError):
    """A base model's host is gone or did not answer in time; the message names the base and the key."""


class HostHandle(Protocol):
    """A base model's host, wherever it runs."""

    base_model: str
    vocab_size: int
    context: int | None
    eos_ids: frozenset[int]
    dead: bool

    def call(self, fn: Callable[[AdapterHost], T]) -> T: ...

    def close(self) -> None: ...


class LocalHost:
    """The host in this process."""

    def __init__(self, base_model: str, model_path: str | Path) -> None:
        self.base_model = base_model
        self.dead = False
        self.host = AdapterHost(model_path)
        self.vocab_size = self.host.vocab_size
        self.context = self.host.context
        self.eos_ids = self.host.eos_ids

    def call(self, fn: Callable[[AdapterHost], T]) -> T:
        return fn(self.host)

    def close(self) -> None:
        return None


class _HostActor:
    """The Ray actor holding one `AdapterHost` (wrapped by `ray.remote` in `RayHost`)."""

    def __init__(self, model_path: str, torch_threads: int) -> None:
        if torch_threads > 0:
            import torch

            torch.set_num_threads(torch_threads)
        self.host = AdapterHost(model_path)

    def limits(self) -> tuple[int, int | None, frozenset[int]]:
        return self.host.vocab_size, self.host.context, self.host.eos_ids

    def run(self, fn: Callable[[AdapterHost], Any]) -> Any:
        return fn(self.host)


class RayHost:
    """The host in a Ray actor of its own (module doc)."""

    def __init__(
        self,
        base_model: str,
        model_path: str | Path,
        *,
        gpus: float,
        torch_threads: int,
        start_timeout_s: float,
        call_timeout_s: float,
    ) -> None:
        import ray

        self.base_model = base_model
        self.dead = False
        self.call_timeout_s = call_timeout_s
        actor_class: Any = ray.remote(_HostActor)
        self.actor: Any = actor_class.options(
            num_cpus=max(1, torch_threads), num_gpus=gpus, max_restarts=0
        ).remote(str(model_path), torch_threads)
        try:
            limits = ray.get(self.actor.limits.remote(), timeout=start_timeout_s)
            self.vocab_size = int(limits[0])
            self.context = limits[1]
            self.eos_ids = frozenset(limits[2])
        except Exception as err:
            ray.kill(self.actor)
            raise HostError(
                f"the Ray host of base model {base_model!r} did not start within {start_timeout_s:g} s "
                f"(start_timeout_s): {type(err).__name__}: {err}"
            ) from err

    def call(self, fn: Callable[[AdapterHost], T]) -> T:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            result: T = ray.get(self.actor.run.remote(fn), timeout=self.call_timeout_s)
        except GetTimeoutError as err:
            raise HostError(
                f"base model {self.base_model!r}: no answer within {self.call_timeout_s:g} s (call_timeout_s)"
            ) from err
        except RayActorError as err:
            self.dead = True  # the next create_model on this base starts a new host
            raise HostError(
                f"the Ray host of base model {self.base_model!r} died; its clients' unsaved state is lost "
                f"(a new client starts a new host; load_state restores a saved one): {err}"
            ) from err
        return result

    def close(self) -> None:
        import ray

        ray.kill(self.actor)


def start_host(base_model: str, model_path: str | Path, config: Any) -> HostHandle:
    """The host of `base_model` as `config.backend` says (`TinkerServiceConfig`)."""
    if config.backend == "local":
        return LocalHost(base_model, model_path)
    from quartet.cluster.ray_session import connect
    from quartet.config.cluster import ClusterConfig

    connect(ClusterConfig(address=config.ray_address, namespace=config.ray_namespace))
    return RayHost(
        base_model,
        model_path,
        gpus=config.gpus_per_base,
        torch_threads=config.torch_threads,
        start_timeout_s=config.start_timeout_s,
        call_timeout_s=config.call_timeout_s,
    )
