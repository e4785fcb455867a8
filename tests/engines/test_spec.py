"""EngineSpec and MicroSpec: config strings accepted, impossible combinations refused early."""

from __future__ import annotations

import pytest

from quartet.config.model import Dtype, LoraConfig
from quartet.config.optim import LrSchedule, OptimConfig
from quartet.config.roles import MicroBatching
from quartet.engines import EngineSpec, MicroSpec, ModelKind


def test_config_strings_become_enum_members() -> None:
    spec = EngineSpec("/m", kind="value", mixed_precision="float32")  # type: ignore[arg-type]
    assert spec.kind is ModelKind.VALUE and spec.mixed_precision is Dtype.FLOAT32
    assert not spec.trainable and not spec.uses_lora
    assert not EngineSpec("/m", lora=LoraConfig(rank=0)).uses_lora


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model_path": ""}, "model_path"),
        ({"optim": OptimConfig(), "mixed_precision": Dtype.FLOAT16}, "float16"),
        ({"kind": ModelKind.REWARD, "lora": LoraConfig(rank=4)}, "reward"),
        ({"optim": OptimConfig(schedule=LrSchedule.COSINE, warmup_steps=5), "total_steps": 5}, "total_steps"),
    ],
)
def test_impossible_specs_are_refused(kwargs: dict[str, object], match: str) -> None:
    args = {"model_path": "/m", **kwargs}
    with pytest.raises(ValueError, match=match):
        EngineSpec(**args)  # type: ignore[arg-type]


def test_micro_spec_from_config() -> None:
    assert MicroSpec.from_config(MicroBatching(micro_batch_size_per_device=3)) == MicroSpec(size=3)
    dynamic = MicroBatching(use_dynamic_batch=True, max_tokens_per_micro_batch=100)
    assert MicroSpec.from_config(dynamic).max_tokens == 100
    with pytest.raises(ValueError):
        MicroSpec(size=0)
