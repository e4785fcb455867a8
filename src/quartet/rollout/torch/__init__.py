"""The built-in PyTorch rollout engine and the parts only it uses.

`TorchRolloutEngine` (`engine`) is what callers build; the rest is its machinery, kept out of
`quartet.rollout` so the package top holds only what every engine shares (the interface, the types, the
factory, the request thread, batch conversion):

    engine_core    admission, prefill and decode steps, per-request failure isolation
    scheduler      which waiting requests a step admits
    slot_table     per-slot decoding state kept on the device
    kv_cache       the slot-based KV cache
    model_runner   the model's forward over the cache (supported architectures)
    graph_decode   decode steps replayed from CUDA graphs per bucketed shape
    fp8            fp8 weights of the decoder projections (`rollout.quantization=fp8`)
    sampling       on-device sampling and log-probs
    penalties      presence/frequency/repetition penalties and min_tokens
    sequence       one sample's state while it is generated
    stopping       stop ids, stop strings and length limits
"""

from __future__ import annotations

from quartet.rollout.torch.engine import TorchRolloutEngine

__all__ = ["TorchRolloutEngine"]
