"""What the Tinker API costs over calling quartet's model host directly (issue 51, "Cost").

    .venv/bin/python benchmarks/tinker_overhead.py [--calls 30] [--datums 4] [--tokens 64]

The same `forward_backward` (cross_entropy, `--datums` x `--tokens` tokens, the tiny model, LoRA rank 8)
two ways, alternated call by call in one run (A/B, so a busy machine bends both alike):
- SDK: `tinker.ServiceClient` -> HTTP -> `quartet serve tinker` (in this process, `backend: local`) ->
  the base model's thread -> the adapter; the result back as protobuf through the SDK's future;
- direct: `backend.forward_backward` on an `AdapterHost` in this process (what the service runs).
torch runs 1 thread (a service sharing 2 cores with its client). The difference is the API's overhead.
A JSON result goes to benchmarks/results/tinker_overhead.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import spread, table, write_result  # noqa: E402


def main() -> None:
    raw_help = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw_help)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--datums", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import tinker
    from tinker import types

    from quartet.config import TinyModelConfig
    from quartet.models.tiny import ensure_tiny_model
    from quartet.serving.tinker import backend
    from quartet.serving.tinker.adapters import AdapterHost, AdapterSpec
    from quartet.serving.tinker.server import TinkerServer
    from quartet.serving.tinker.wire import Datum

    model_dir = ensure_tiny_model(TinyModelConfig(), Path(tempfile.mkdtemp(prefix="tinker-bench-")))
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, 200, size=args.tokens + 1) for _ in range(args.datums)]
    sdk_data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1].tolist()),
            loss_fn_inputs={"target_tokens": row[1:].tolist()},
        )
        for row in rows
    ]
    direct_data = [
        Datum(row[:-1].astype(np.int64), {"target_tokens": row[1:].astype(np.int64)}) for row in rows
    ]
    server = TinkerServer({"tiny": model_dir}, api_key="tml-bench")
    url = server.start_in_thread()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        client = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    trainer = client.create_lora_training_client(base_model="tiny", rank=8, seed=0).result()
    host = AdapterHost(model_dir)
    host.add("model-direct", AdapterSpec(8, 0))

    def via_sdk() -> None:
        trainer.forward_backward(sdk_data, "cross_entropy").result()

    def direct() -> None:
        backend.forward_backward(host, "model-direct", "cross_entropy", direct_data, forward_only=False)

    for _ in range(3):
        via_sdk()
        direct()
    times: dict[str, list[float]] = {"sdk": [], "direct": []}
    for _ in range(args.calls):
        for name, fn in (("sdk", via_sdk), ("direct", direct)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    server.stop_thread()
    sdk, dir_ = statistics.median(times["sdk"]), statistics.median(times["direct"])
    summary = {
        "forward_backward_sdk_ms": 1e3 * sdk,
        "forward_backward_direct_ms": 1e3 * dir_,
        "forward_backward_overhead_ms": 1e3 * (sdk - dir_),
    }
    print(table(["forward_backward", "median ms"], [[k, v] for k, v in summary.items()]))
    raw = {name: spread(values) | {"values": values} for name, values in times.items()}
    write_result("tinker_overhead", vars(args) | {"torch_threads": 1}, raw, summary)


if __name__ == "__main__":
    main()
