"""Weight sync: streaming a trainer's weights to rollout processes on other processes or nodes.

The first building block of asynchronous RL, where the rollout engines are not in the trainer's process.
`group` forms a standalone process group (sender = rank 0, receivers = ranks 1..N) that leaves
torch.distributed's default group alone; `buckets` packs named tensors into flat byte buckets and back,
bitwise; `frames` is the wire format and the per-sync deadline; `transport` streams one versioned sync
bucket by bucket (`WeightSender.send`, `WeightReceiver.receive`), with every wait bounded and failures
raised as `WeightSyncError`; `shared` lets a same-node sender hand out bucket buffers instead of bytes
(CUDA IPC handles, or host shared memory on CPU; `SyncTransport`).

Importing this package imports torch but not Ray.
"""

from __future__ import annotations

from quartet.weight_sync.buckets import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    TensorMeta,
    iter_buckets,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
)
from quartet.weight_sync.errors import BackendUnavailableError, GroupJoinError, WeightSyncError
from quartet.weight_sync.frames import SyncStats
from quartet.weight_sync.group import (
    GroupConfig,
    GroupListener,
    SyncBackend,
    WeightSyncGroup,
    connect,
    create_group,
    listen,
)
from quartet.weight_sync.shared import SharedBufferError, allocate_shared, export_buffer, open_buffer
from quartet.weight_sync.transport import (
    ReceivedWeights,
    SyncTransport,
    WeightReceiver,
    WeightSender,
    measure_plain_broadcast,
)

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "BackendUnavailableError",
    "Bucket",
    "GroupConfig",
    "GroupJoinError",
    "GroupListener",
    "ReceivedWeights",
    "SyncBackend",
    "SharedBufferError",
    "SyncStats",
    "SyncTransport",
    "TensorMeta",
    "WeightReceiver",
    "WeightSender",
    "WeightSyncError",
    "WeightSyncGroup",
    "allocate_shared",
    "connect",
    "create_group",
    "export_buffer",
    "iter_buckets",
    "listen",
    "measure_plain_broadcast",
    "open_buffer",
    "pack_bucket",
    "plan_buckets",
    "unpack_bucket",
]
