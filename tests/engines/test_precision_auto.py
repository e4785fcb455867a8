"""`mixed_precision: auto`: the choice follows measured matmul speed, is cached per machine, can be pinned,
is resolved where the engine is built, and is refused where it means nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quartet.cli.doctor_checks import precision_check
from quartet.config import ConfigError, load_config
from quartet.config.model import Dtype
from quartet.engines import EngineSpec, precision


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(precision.ENV, raising=False)
    return tmp_path / "quartet" / "precision.json"


def _speeds(monkeypatch: pytest.MonkeyPatch, fp32: float, bf16: float) -> list[torch.dtype]:
    calls: list[torch.dtype] = []

    def fake(dtype: torch.dtype, size: int = 0, budget_s: float = 0.0) -> float:
        calls.append(dtype)
        return fp32 if dtype is torch.float32 else bf16

    monkeypatch.setattr(precision, "_gflops", fake)
    return calls


@pytest.mark.parametrize(
    ("fp32", "bf16", "choice"),
    [
        (100.0, 400.0, Dtype.BFLOAT16),
        (100.0, 105.0, Dtype.FLOAT32),
        (160.0, 80.0, Dtype.FLOAT32),
        (89.0, 0.3, Dtype.FLOAT32),
    ],
)
def test_bf16_only_where_it_measures_faster_by_the_margin(
    monkeypatch: pytest.MonkeyPatch, fp32: float, bf16: float, choice: Dtype
) -> None:
    _speeds(monkeypatch, fp32, bf16)
    assert precision.resolve_precision("auto", "cpu") is choice
    assert (bf16 >= precision.MARGIN * fp32) == (choice is Dtype.BFLOAT16)


def test_the_figures_are_cached_per_machine(monkeypatch: pytest.MonkeyPatch, own_cache: Path) -> None:
    calls = _speeds(monkeypatch, 100.0, 400.0)
    first = precision.auto_precision()
    assert calls == [torch.float32, torch.bfloat16] and first.cache == str(own_cache)
    stored = json.loads(own_cache.read_text())
    assert stored[precision.machine_key()]["choice"] == "bfloat16"
    again = precision.auto_precision()
    assert len(calls) == 2 and again.float32_gflops == 100.0  # read back, not measured
    stored["another machine | AVX2"] = {**stored[precision.machine_key()], "key": "another machine | AVX2"}
    own_cache.write_text(json.dumps(stored))
    precision.auto_precision(refresh=True)
    assert len(calls) == 4 and "another machine | AVX2" in json.loads(own_cache.read_text())  # kept


def test_a_real_measurement_gives_positive_figures() -> None:
    figures = precision.measure_matmul(budget_s=0.01)
    assert figures.float32_gflops > 0 and figures.bfloat16_gflops > 0
    assert figures.choice in ("float32", "bfloat16") and torch.__version__ in figures.key


def test_a_pin_skips_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _speeds(monkeypatch, 100.0, 400.0)
    monkeypatch.setenv(precision.ENV, "float32")
    assert precision.resolve_precision(Dtype.AUTO) is Dtype.FLOAT32 and calls == []
    assert "pinned to float32" in precision_check("cpu").message
    monkeypatch.setenv(precision.ENV, "auto")
    with pytest.raises(ValueError, match="pin float32 or bfloat16"):
        precision.resolve_precision(Dtype.AUTO)


def test_explicit_precisions_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _speeds(monkeypatch, 100.0, 400.0)
    for dtype in (Dtype.FLOAT32, Dtype.BFLOAT16, Dtype.FLOAT16):
        assert precision.resolve_precision(dtype) is dtype
    assert calls == []


def test_the_engine_spec_resolves_auto_and_doctor_reports_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _speeds(monkeypatch, 100.0, 400.0)
    assert EngineSpec("model", mixed_precision=Dtype.AUTO).mixed_precision is Dtype.BFLOAT16
    _speeds(monkeypatch, 160.0, 80.0)
    precision.auto_precision(refresh=True)
    assert EngineSpec("model", mixed_precision="auto").mixed_precision is Dtype.FLOAT32
    detail = precision_check("cpu").message
    assert "auto -> float32" in detail and "80.0 GFLOP/s in bf16 vs 160.0 in fp32" in detail


def test_auto_is_the_roles_default_and_refused_for_weights() -> None:
    cfg = load_config(None, [])
    assert cfg.actor.mixed_precision is Dtype.AUTO and cfg.critic.mixed_precision is Dtype.AUTO
    for key in ("model.dtype", "rollout.dtype"):
        with pytest.raises(ConfigError, match=f"{key}: auto is for <role>.mixed_precision only"):
            load_config(None, [f"{key}=auto"])
