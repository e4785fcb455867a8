"""Offload round trip, save/load of the full engine state, and the consolidated HF export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from engine_cases import make_batch, pg_loss, value_mse
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from quartet.config.model import Dtype
from quartet.config.optim import LrSchedule, OptimConfig
from quartet.engines import EngineSpec, EngineStateError, MicroSpec, ModelKind, TrainingEngine
from quartet.engines.hf_modules import hf_model

PROMPTS = [4, 2, 6, 3]
RESPONSES = [3, 5, 1, 4]
OPTIM = OptimConfig(lr=1e-2, warmup_steps=1, schedule=LrSchedule.COSINE)


def _engine(path: Path, **kw: object) -> TrainingEngine:
    spec = EngineSpec(str(path), ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=OPTIM, total_steps=10, **kw)  # type: ignore[arg-type]
    return TrainingEngine(spec)


def _clone(state: object) -> object:
    """Deep copy of nested dicts/lists with every tensor cloned."""
    if isinstance(state, torch.Tensor):
        return state.detach().clone()
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_clone(v) for v in state)
    return state


def _assert_same(a: object, b: object, where: str = "") -> None:
    """Bit-identical nested state (tensors by torch.equal and dtype, the rest by ==)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where  # type: ignore[arg-type]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):  # type: ignore[call-overload]
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_offload_round_trip_is_bit_identical(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, param_offload=True, optimizer_offload=True)
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_step(batch, pg_loss, MicroSpec(size=2))
    before = _clone(engine.state_dict())
    ptrs = {n: p.data_ptr() for n, p in engine.module.named_parameters()}
    moments = [s["exp_avg"].data_ptr() for s in engine.optimizer.state.values()]  # type: ignore[union-attr]

    engine.offload()  # CPU training: host memory is the compute device, nothing moves
    assert not engine.offloaded and ptrs == {n: p.data_ptr() for n, p in engine.module.named_parameters()}

    engine.offload(force=True)
    assert engine.offloaded
    assert all(ptrs[n] != p.data_ptr() for n, p in engine.module.named_parameters())  # fresh storage
    assert all(  # type: ignore[union-attr]
        s["exp_avg"].data_ptr() != m for s, m in zip(engine.optimizer.state.values(), moments, strict=True)
    )
    with pytest.raises(EngineStateError, match="onload"):
        engine.forward_logprobs(batch, 1.0, MicroSpec())
    engine.onload()
    assert not engine.offloaded
    _assert_same(before, engine.state_dict())
    emb = hf_model(engine.module)
    assert emb.get_input_embeddings().weight is emb.get_output_embeddings().weight  # still tied
    engine.train_step(batch, pg_loss, MicroSpec(size=2))  # and it still trains


def test_save_then_load_restores_everything(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    batch = make_batch(PROMPTS, RESPONSES)
    for _ in range(2):
        engine.train_step(batch, pg_loss, MicroSpec(size=2))
    engine.save(tmp_path / "ckpt")
    saved = _clone(engine.state_dict())
    assert set(saved) == {"model", "optimizer", "scheduler", "rng", "counters"}  # type: ignore[arg-type]

    engine.train_step(batch, pg_loss, MicroSpec(size=2))  # move every part of the state on
    torch.rand(10)
    engine.load(tmp_path / "ckpt")
    _assert_same(saved, engine.state_dict())

    fresh = _engine(tiny_model_dir)  # a new process would start like this
    fresh.load(tmp_path / "ckpt")
    _assert_same(saved, fresh.state_dict())
    assert fresh.steps == 2
    a = engine.train_step(batch, pg_loss, MicroSpec(size=2))
    b = fresh.train_step(batch, pg_loss, MicroSpec(size=2))
    assert a == b  # identical continuation (loss, grad norm, lr)
    _assert_same(engine.state_dict()["model"], fresh.state_dict()["model"])


def test_in_memory_state_dict_round_trip(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir)
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_step(batch, pg_loss, MicroSpec(size=2))
    saved = _clone(engine.state_dict())
    engine.train_step(batch, pg_loss, MicroSpec(size=2))
    engine.load_state_dict(saved)  # type: ignore[arg-type]
    _assert_same(saved, engine.state_dict())


def test_checkpoint_before_any_step_keeps_the_optimizer_empty(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    engine.save(tmp_path / "ckpt")
    assert not engine.optimizer.state  # type: ignore[union-attr]  # saving did not fake a first step
    fresh = _engine(tiny_model_dir)
    fresh.load(tmp_path / "ckpt")
    assert not fresh.optimizer.state  # type: ignore[union-attr]
    batch = make_batch(PROMPTS, RESPONSES)
    a = engine.train_step(batch, pg_loss, MicroSpec(size=4))
    assert a == fresh.train_step(batch, pg_loss, MicroSpec(size=4))


def test_hf_export_reloads_with_the_same_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    engine = _engine(tiny_model_dir)
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_step(batch, pg_loss, MicroSpec(size=2))
    folder = engine.export_hf(tmp_path / "hf")
    assert folder is not None
    assert (folder / "tokenizer_config.json").exists() and (folder / "chat_template.jinja").exists()
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    for name, p in hf_model(engine.module).state_dict().items():
        assert torch.equal(p, model.state_dict()[name]), name
    reloaded = TrainingEngine(EngineSpec(str(folder), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    want, _ = engine.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    got, _ = reloaded.forward_logprobs(batch, 1.0, MicroSpec(size=4))
    assert torch.equal(got, want)


def test_value_model_export_keeps_its_head(value_model_dir: Path, tmp_path: Path) -> None:
    spec = EngineSpec(str(value_model_dir), ModelKind.VALUE, Dtype.FLOAT32, optim=OptimConfig(lr=1e-2))
    engine = TrainingEngine(spec)
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_step(batch, value_mse, MicroSpec(size=4))
    folder = engine.export_hf(tmp_path / "hf")
    assert folder is not None
    model = AutoModelForTokenClassification.from_pretrained(folder, local_files_only=True)
    assert torch.equal(model.score.weight, hf_model(engine.module).score.weight)


def test_a_failed_checkpoint_write_names_its_cause_on_the_first_line(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """torch wraps a write error in a CheckpointException whose first line names only the ranks; a run's
    failure line is that first line, so the save re-raises the rank's own error (a full disk: ENOSPC)."""
    engine = _engine(tiny_model_dir)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "dcp").write_text("a file where the checkpoint's folder goes")
    with pytest.raises(OSError) as caught:
        engine.save(tmp_path / "ckpt")
    first = str(caught.value).splitlines()[0]
    assert "writing checkpoint" in first and str(tmp_path / "ckpt") in first and "(rank 0)" in first
    assert caught.value.errno is not None and caught.value.strerror in first  # the OS's own words
