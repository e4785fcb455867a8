"""`CheckpointStore` on its own (no service, no SDK): the path grammar, confinement, atomic saves, no pickle.

The SDK-driven checks (save/load through the service, restart, hostile requests) are in test_checkpoints.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from quartet.serving.tinker.checkpoints import (
    SAMPLER,
    TRAINING,
    CheckpointPath,
    CheckpointStore,
    MissingError,
    RunRecord,
    parse_path,
)
from quartet.serving.tinker.wire import WireError


def _store(tmp_path: Path) -> CheckpointStore:
    store = CheckpointStore(tmp_path / "state")
    store.register_run(RunRecord("model-a", "tiny", 4, 7, True, False, True))
    return store


def test_the_path_grammar_is_the_sdks() -> None:
    assert parse_path("tinker://s-1:train:0/weights/step-1") == CheckpointPath(
        "s-1:train:0", TRAINING, "step-1"
    )
    assert parse_path("tinker://m/sampler_weights/a.b_c").tinker_path == "tinker://m/sampler_weights/a.b_c"
    for bad in ("tinker://m/weights", "tinker://m/weights/a/b", "tinker://m/weights/..", "m/weights/a",
                "tinker://m/weights/a\nb", "tinker://m/weights/-a", 3):  # fmt: skip
        with pytest.raises(WireError) as err:
            parse_path(bad, "model_path")
        assert err.value.field == "model_path"


def test_a_training_checkpoint_round_trips_bitwise_without_pickle(tmp_path: Path) -> None:
    store = _store(tmp_path)
    adapter = {"x.lora_A.weight": torch.randn(4, 8), "x.lora_B.weight": torch.randn(8, 4)}
    moments = {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 8), "exp_avg_sq": torch.rand(4, 8)}
    groups = [
        {"lr": 0.05, "betas": (0.9, 0.95), "eps": 1e-12, "foreach": None, "params": ["x.lora_A.weight"]}
    ]
    optimizer = {"state": {"x.lora_A.weight": moments}, "param_groups": groups, "steps": 3}
    path = store.save("model-a", TRAINING, "s1", adapter, optimizer, {"user_metadata": {"k": "v"}})
    assert path.tinker_path == "tinker://model-a/weights/s1"
    got, state, meta = store.load(path.tinker_path)
    assert got.keys() == adapter.keys() and all(torch.equal(got[k], adapter[k]) for k in adapter)
    assert state is not None and state["steps"] == 3 and state["param_groups"][0]["betas"] == [0.9, 0.95]
    assert all(torch.equal(state["state"]["x.lora_A.weight"][k], v) for k, v in moments.items())
    assert meta["run"]["lora_rank"] == 4 and meta["user_metadata"] == {"k": "v"}
    files = sorted(p.name for p in (tmp_path / "state" / "model-a" / "weights" / "s1").iterdir())
    assert files == ["adapter.safetensors", "meta.json", "optimizer.safetensors"]  # no pickle anywhere
    assert store.resolve(path.tinker_path)[:2] == ("tiny", 4)
    with pytest.raises(WireError, match="is a training checkpoint, not sampler_weights"):
        store.load(path.tinker_path, kind=SAMPLER)


def test_a_failed_save_leaves_nothing_and_an_existing_name_needs_overwrite(tmp_path: Path) -> None:
    store = _store(tmp_path)
    adapter = {"w": torch.ones(2)}
    store.save("model-a", TRAINING, "s1", adapter, None)
    with pytest.raises(WireError, match="overwrite=True"):
        store.save("model-a", TRAINING, "s1", adapter, None)
    with pytest.raises(TypeError, match="cannot be stored"):
        store.save("model-a", TRAINING, "s2", adapter, {"state": {"w": object()}})
    kind_dir = tmp_path / "state" / "model-a" / "weights"
    assert sorted(p.name for p in kind_dir.iterdir()) == ["s1"]  # no s2, no temporary folder left
    store.save("model-a", TRAINING, "s1", {"w": torch.zeros(2)}, None, overwrite=True)
    assert torch.equal(store.load("tinker://model-a/weights/s1")[0]["w"], torch.zeros(2))
    assert sorted(p.name for p in kind_dir.iterdir()) == ["s1"]
    store.delete("tinker://model-a/weights/s1")
    assert list(kind_dir.iterdir()) == []
    with pytest.raises(MissingError, match="never saved, or deleted"):
        store.load("tinker://model-a/weights/s1")


def test_symlinks_anywhere_in_the_store_are_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "run.json").write_text('{"model_id": "x"}')
    os.symlink(outside, tmp_path / "state" / "model-b")  # a whole run that is a link
    with pytest.raises(WireError, match="symbolic link") as err:
        store.run("model-b")
    assert not isinstance(err.value, MissingError)
    os.symlink(outside, tmp_path / "state" / "model-a" / "sampler_weights")  # a kind folder that is a link
    with pytest.raises(WireError, match="symbolic link"):
        store.save("model-a", SAMPLER, "s", {"w": torch.ones(1)})
    assert [r.model_id for r in store.runs()] == ["model-a"]
    assert sorted(p.name for p in outside.iterdir()) == ["run.json"]


def test_sweep_removes_only_what_interrupted_writes_left(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.save("model-a", TRAINING, "kept", {"w": torch.ones(1)})
    run_dir = tmp_path / "state" / "model-a"
    (run_dir / "weights" / f".tmp-{'a' * 32}").mkdir()
    (run_dir / "weights" / f".del-{'b' * 32}" / "x").mkdir(parents=True)
    (run_dir / f".run.json.{'c' * 32}").write_text("{")
    (run_dir / "weights" / ".tmp-not-ours").mkdir()  # not a name the store makes: left alone
    assert store.sweep() == 3
    assert sorted(p.name for p in (run_dir / "weights").iterdir()) == [".tmp-not-ours", "kept"]
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json", "weights"]
    assert torch.equal(store.load("tinker://model-a/weights/kept")[0]["w"], torch.ones(1))
