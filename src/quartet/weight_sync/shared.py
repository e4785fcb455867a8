"""Bucket buffers shared between processes of one node: CUDA IPC handles, or host shared memory on CPU.

Why: on one node, broadcasting a bucket's bytes through gloo copies them device -> host -> socket -> host
-> device. A handle instead lets each receiver map the sender's own buffer and copy straight from it (on a
GPU, a device-to-device copy; no byte goes through the host). Only the handle, a few hundred bytes, travels
through the group's control channel.

- CUDA: `torch.multiprocessing.reductions.reduce_tensor` gives `rebuild_cuda_tensor` and its arguments
  (a cudaIpcMemHandle, the storage size and offset, a shared reference counter and an event). They are
  written as JSON (bytes in base64, types and dtypes by name), never pickled, so a receiver only ever
  calls `rebuild_cuda_tensor` itself. The sender's device travels by UUID: each Ray worker numbers its
  visible GPUs from 0, so an index would name a different GPU in another process.
- CPU (the same protocol, to test it without a GPU, and for CPU runs on one node): the buffer lives in a
  named shared-memory segment (torch's `file_system` sharing: a segment name plus torch_shm_manager's
  socket, reachable from any process on the node, unlike the default file-descriptor strategy, which needs
  the sender's multiprocessing authkey and so works only between a parent and its own children).

A receiver's view of a shared buffer stays valid only while the sender keeps the buffer: the transport has
each receiver acknowledge a bucket after copying it, and the sender frees it only then.
"""

from __future__ import annotations

import base64
import inspect
from collections import OrderedDict
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

__all__ = [
    "MappedBuffers",
    "SharedBufferError",
    "allocate_shared",
    "export_buffer",
    "gpu_uuid",
    "open_buffer",
    "visible_gpus",
]

_DEVICE_ARG = list(inspect.signature(rebuild_cuda_tensor).parameters).index("storage_device")
"""Where the device index sits among `rebuild_cuda_tensor`'s arguments (looked up, not assumed)."""

_TYPES: dict[str, type] = {
    "Tensor": torch.Tensor,
    "TypedStorage": torch.storage.TypedStorage,
    "UntypedStorage": torch.UntypedStorage,
}
"""The only types a handle may name, matched exactly (the receiver never builds a type from the wire)."""


class SharedBufferError(RuntimeError):
    """A shared buffer cannot be opened here (for example the sender's GPU is not visible in this process)."""


def allocate_shared(nbytes: int, device: torch.device) -> torch.Tensor:
    """A new 1-D uint8 buffer of `nbytes` that `export_buffer` can share: on `device` when it is CUDA, else in
    named host shared memory."""
    # at least one byte: an empty storage has no allocation to share
    if device.type == "cuda":
        return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)[:nbytes]
    if device.type != "cpu":
        raise ValueError(f"shared buffers live on CUDA or in host shared memory, not on {device}")
    buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    buffer.untyped_storage()._share_filename_cpu_()
    return buffer[:nbytes]


def _encode(value: Any) -> Any:
    """One of `rebuild_cuda_tensor`'s arguments as JSON."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        name = next((key for key, known in _TYPES.items() if value is known), None)
        if name is None:
            raise TypeError(f"cannot share a buffer whose handle names the type {value.__name__}")
        return {"type": name}
    if isinstance(value, tuple):  # torch.Size included
        return {"tuple": [_encode(item) for item in value]}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"unexpected {type(value).__name__} in a CUDA IPC handle")


def _decode(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    if "b64" in value:
        return base64.b64decode(value["b64"])
    if "dtype" in value:
        dtype = getattr(torch, str(value["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise SharedBufferError(f"unknown dtype {value['dtype']!r} in a CUDA IPC handle")
        return dtype
    if "type" in value:
        if str(value["type"]) not in _TYPES:
            raise SharedBufferError(f"a CUDA IPC handle names the unknown type {value['type']!r}")
        return _TYPES[str(value["type"])]
    return tuple(_decode(item) for item in value["tuple"])


def export_buffer(buffer: torch.Tensor) -> dict[str, Any]:
    """A JSON-ready handle to `buffer` (from `allocate_shared`) that another process on this node can open.

    On CUDA, the work queued on the current stream so far (the packing) is finished first: the receiver
    may read the moment it gets the handle.
    """
    if buffer.dtype != torch.uint8 or buffer.dim() != 1:
        raise ValueError(f"a shared bucket buffer is 1-D uint8, got {buffer.dtype} {tuple(buffer.shape)}")
    if buffer.is_cuda:
        torch.cuda.current_stream(buffer.device).synchronize()
        _, args = reduce_tensor(buffer)  # type: ignore[no-untyped-call]
        return {"kind": "cuda", "uuid": gpu_uuid(buffer.device), "args": [_encode(arg) for arg in args]}
    storage = buffer.untyped_storage()
    if not storage.is_shared():
        raise ValueError("this CPU buffer is not in shared memory; make it with allocate_shared")
    manager, name, size = storage._share_filename_cpu_()  # already shared: returns its existing name
    return {
        "kind": "shm",
        "manager": base64.b64encode(manager).decode(),
        "name": base64.b64encode(name).decode(),
        "size": int(size),
        "offset": buffer.storage_offset(),
        "numel": buffer.numel(),
    }


def visible_gpus() -> list[str]:
    """UUIDs of the GPUs this process sees (empty without CUDA): a receiver publishes them so the sender can
    tell whether a CUDA IPC handle to its GPU would open there."""
    if not torch.cuda.is_available():
        return []
    return [str(torch.cuda.get_device_properties(i).uuid) for i in range(torch.cuda.device_count())]


def gpu_uuid(device: torch.device) -> str:
    """The UUID of a CUDA device (the same in every process, unlike its index)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def _local_cuda_index(uuid: str) -> int:
    """This process's index of the GPU with `uuid` (each process numbers its visible GPUs from 0)."""
    if not torch.cuda.is_available():
        raise SharedBufferError("the sender shares a CUDA buffer, but this process has no CUDA device")
    for index in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(index).uuid) == uuid:
            return index
    raise SharedBufferError(
        f"the sender's GPU {uuid} is not visible in this process (it sees {torch.cuda.device_count()} "
        "GPU(s)); put the rollout on the actor's GPUs or set rollout.weight_sync.transport=gloo"
    )


def open_buffer(handle: dict[str, Any]) -> torch.Tensor:
    """The 1-D uint8 buffer a handle from `export_buffer` names, mapped into this process (no copy).

    The result reads the sender's memory: copy out of it, drop it, and only then tell the sender it may
    free the buffer.
    """
    if handle.get("kind") == "cuda":
        args = [_decode(arg) for arg in handle["args"]]
        args[_DEVICE_ARG] = _local_cuda_index(str(handle["uuid"]))
        tensor: torch.Tensor = rebuild_cuda_tensor(*args)  # type: ignore[no-untyped-call]
        return tensor
    if handle.get("kind") == "shm":
        manager, name = base64.b64decode(handle["manager"]), base64.b64decode(handle["name"])
        try:
            storage = torch.UntypedStorage._new_shared_filename_cpu(manager, name, int(handle["size"]))
        except RuntimeError as exc:
            raise SharedBufferError(f"cannot map shared-memory segment {name!r}: {exc}") from exc
        offset, numel = int(handle["offset"]), int(handle["numel"])
        return torch.empty(0, dtype=torch.uint8).set_(storage, offset, (numel,), (1,))
    raise SharedBufferError(f"unknown shared-buffer handle kind {handle.get('kind')!r}")


class MappedBuffers:
    """A receiver's mappings of the sender's buffers, kept for the rest of one sync (the last `keep`).

    The sender reuses a couple of buffers bucket after bucket, and mapping one is the costly step (a new
    shared-memory mapping; on CUDA, cudaIpcOpenMemHandle): a handle seen before is served from here. For
    CUDA, torch itself reuses an open handle while a tensor on it is alive, so keeping the tensor suffices.
    Drop the object when the sync ends, so the sender's buffers can really be freed.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._mapped: OrderedDict[str, torch.Tensor] = OrderedDict()

    def open(self, handle: dict[str, Any]) -> torch.Tensor:
        """The buffer `handle` names (see `open_buffer`), mapping its memory only when not mapped yet."""
        if handle.get("kind") != "shm":
            tensor = open_buffer(handle)
            self._keep(f"cuda:{len(self._mapped)}:{id(tensor)}", tensor)
            return tensor
        key = str(handle["name"])
        whole = self._mapped.get(key)
        if whole is None:
            whole = open_buffer(handle | {"offset": 0, "numel": int(handle["size"])})
        self._keep(key, whole)
        offset, numel = int(handle["offset"]), int(handle["numel"])
        if offset + numel > whole.numel():
            raise SharedBufferError(
                f"bytes {offset}..{offset + numel} lie outside segment of {whole.numel()}"
            )
        return whole[offset : offset + numel]

    def _keep(self, key: str, tensor: torch.Tensor) -> None:
        self._mapped[key] = tensor
        self._mapped.move_to_end(key)
        while len(self._mapped) > self.keep:
            self._mapped.popitem(last=False)
