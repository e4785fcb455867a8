"""Cross-field rules of MoE routing record and replay (`rollout.record_routing`, `actor.routing_replay`).

Recording needs the built-in engine (it hooks the routers of its own forwards) and a mixture-of-experts
model; the recorded indices reach the trainer with the batch, single-turn or through the agent loops
(`rollout.multi_turn`), with or without the HTTP server (`rollout.interface=server`), and replay keeps each
token's indices aligned with the packed or padded rows of one rank, which sequence and tensor parallelism
would cut (docs/moe_routing_replay.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from quartet.config.errors import ConfigError
from quartet.config.moe_shapes import SHAPE_MODEL_TYPES
from quartet.config.roles import RoutingReplay
from quartet.config.rollout import RolloutEngineKind
from quartet.config.root import QuartetConfig

__all__ = ["routing_problems"]

_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
"""config.json keys that name the experts of an MoE model (Qwen-MoE, Mixtral, DeepSeek)."""


def _is_moe_folder(path: str) -> bool | None:
    """Whether the model folder's config.json names experts; None when it cannot be read here."""
    config = Path(path) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    text = data.get("text_config", data)
    return any(int(text.get(key) or 0) > 0 for key in _EXPERT_KEYS)


def _model_type(path: str) -> str:
    """The folder's config.json `model_type` ('' when it cannot be read here)."""
    try:
        return str(json.loads((Path(path) / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError):
        return ""


def routing_problems(cfg: QuartetConfig) -> list[ConfigError]:
    """What keeps this run from recording (and replaying) MoE routing; empty when it does neither."""
    replay = cfg.actor.routing_replay is RoutingReplay.ROLLOUT
    if not (replay or cfg.rollout.record_routing):
        return []
    key = "actor.routing_replay" if replay else "rollout.record_routing"
    fix_off = f"set {key}={'off' if replay else 'false'}"
    out: list[ConfigError] = []
    model = cfg.model
    moe = model.tiny.arch.is_moe if model.is_tiny else _is_moe_folder(model.path)
    what = f"model.tiny.arch={model.tiny.arch}" if model.is_tiny else f"the model in {model.path}"
    if moe is False:
        out.append(ConfigError(key, f"{what} is not a mixture-of-experts model: it has no routing", fix_off))
    kind = model.tiny.arch.value if model.is_tiny else _model_type(model.path)
    if kind in SHAPE_MODEL_TYPES:
        out.append(
            ConfigError(
                key,
                f"{what} is a {kind} model: routing record and replay support softmax top-k routers of the "
                "Qwen3-MoE kind (a `gate` returning its top-k), not its router",
                fix_off,
            )
        )
    if cfg.rollout.engine is not RolloutEngineKind.TORCH:
        out.append(
            ConfigError(
                key,
                f"rollout.engine={cfg.rollout.engine} does not record routing; the built-in engine does",
                f"use rollout.engine=torch, or {fix_off}",
            )
        )
    if replay and (model.sequence_parallel_size > 1 or model.tensor_parallel_size > 1):
        out.append(
            ConfigError(
                key,
                "routing replay feeds each rank its rows' indices; sequence and tensor parallelism "
                f"(model.sequence_parallel_size={model.sequence_parallel_size}, "
                f"model.tensor_parallel_size={model.tensor_parallel_size}) would cut them",
                f"use model.sequence_parallel_size=1 and model.tensor_parallel_size=1, or {fix_off}",
            )
        )
    return out
