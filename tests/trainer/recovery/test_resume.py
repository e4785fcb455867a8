"""Exact resume: N steps + resume + the rest ends with the same parameters as one straight run (CPU, fp32),
whether the resume lands mid-epoch or exactly on an epoch boundary, and a process killed while writing a
checkpoint leaves `latest` on a complete one that resumes.

Runs use the local backend (no Ray) so each takes seconds: the checkpoint and resume code is the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from quartet.cli.train_cmd import finished_text
from quartet.config import QuartetConfig, load_config
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.records.callbacks import StopAfter
from quartet.trainer.recovery.checkpoint import CheckpointError, list_checkpoints
from quartet.trainer.recovery.manifest import write_manifest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_local_rank")]

STEPS = 6  # 16 prompts / 4 per step: an epoch is 4 steps
COMMON = [
    "cluster.backend=local",
    "data.builtin_train_size=16",
    "data.train_batch_size=4",
    "data.max_response_length=8",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=2",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-3",
    "actor.optim.warmup_steps=1",
    "actor.optim.schedule=cosine",
    "actor.use_kl_loss=true",
    "critic.mini_batch_size=2",
    "critic.micro_batch_size_per_device=2",
    "critic.mixed_precision=float32",
    "critic.optim.lr=1e-3",
    f"trainer.total_steps={STEPS}",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
    "trainer.max_checkpoints_to_keep=0",
]
ALGOS = {"grpo": ["algorithm.adv_estimator=grpo"], "gae": ["algorithm.adv_estimator=gae"]}


def _config(model: Path, out: Path, algo: str, *extra: str) -> QuartetConfig:
    return load_config(
        None, [*COMMON, *ALGOS[algo], f"model.path={model}", f"trainer.output_dir={out}", *extra]
    )


def _params(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "hf" / "model.safetensors"))


def _scores(run_dir: Path) -> dict[int, float]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["critic/score/mean"] for r in recs if r["kind"] == "step"}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


@pytest.fixture(scope="module")
def straight(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One uninterrupted run per algorithm."""
    mp = pytest.MonkeyPatch()
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        mp.setenv(key, "0" if key != "WORLD_SIZE" else "1")
    try:
        runs = {}
        for algo in ALGOS:
            result = RLTrainer(_config(tiny_model_dir, tmp_path_factory.mktemp(algo), algo)).run()
            assert result.steps == STEPS
            runs[algo] = result.run_dir
        return runs
    finally:
        mp.undo()


@pytest.mark.parametrize("algo", list(ALGOS))
def test_resume_mid_epoch_and_at_epoch_boundary_is_exact(
    tiny_model_dir: Path, tmp_path: Path, straight: dict[str, Path], algo: str
) -> None:
    cfg = _config(tiny_model_dir, tmp_path, algo)
    first = RLTrainer(cfg, callbacks=StopAfter(3)).run()  # stops mid-epoch (3 of 4 batches)
    assert first.steps == 3 and [p.name for p in list_checkpoints(first.run_dir)] == ["global_step_3"]
    second = RLTrainer(cfg, callbacks=StopAfter(1)).run()  # step 4 ends the epoch: stops on the boundary
    assert second.steps == 4
    state = json.loads((second.run_dir / "checkpoints/global_step_4/trainer_state.json").read_text())
    assert (state["sampler"]["epoch"], state["sampler"]["position"]) == (1, 0)
    third = RLTrainer(cfg).run()
    assert third.steps == STEPS
    assert _scores(third.run_dir) == _scores(straight[algo])  # the same batches, the same samples
    assert _same(_params(third.run_dir), _params(straight[algo])) == []
    assert (tmp_path / "quartet" / "demo" / "checkpoints" / "latest").read_text().strip() == "global_step_6"


def test_sigkill_while_writing_a_checkpoint_leaves_latest_complete(
    tiny_model_dir: Path, tmp_path: Path, straight: dict[str, Path]
) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys
        from quartet.config import load_config
        from quartet.trainer.records.callbacks import RunCallbacks
        from quartet.trainer.loop.rl_trainer import RLTrainer

        class KillInStep4(RunCallbacks):
            def after_roles_saved(self, tmp):
                if tmp.name.endswith("global_step_4"):  # the roles are written, the state file is not
                    os.kill(os.getpid(), signal.SIGKILL)

        RLTrainer(load_config(None, sys.argv[1:]), callbacks=KillInStep4()).run()
        """
    )
    overrides = [*COMMON, *ALGOS["grpo"], f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}"]
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script, *overrides, "trainer.save_freq=2"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    root = tmp_path / "quartet" / "demo" / "checkpoints"
    assert (root / "latest").read_text().strip() == "global_step_2"
    assert (root / ".tmp-global_step_4" / "actor").is_dir()  # killed mid-write
    assert [p.name for p in list_checkpoints(tmp_path / "quartet" / "demo")] == ["global_step_2"]
    cfg = _config(tiny_model_dir, tmp_path, "grpo", "trainer.save_freq=2")
    resumed = RLTrainer(cfg).run()
    assert resumed.steps == STEPS
    assert not (root / ".tmp-global_step_4").exists()  # the half-written folder was cleared
    assert _same(_params(resumed.run_dir), _params(straight["grpo"])) == []
    superseded = resumed.run_dir / "metrics.superseded.jsonl"
    steps_redone = [json.loads(x)["step"] for x in superseded.read_text().splitlines()]
    assert sorted(set(steps_redone)) == [3, 4]  # the killed run's steps 3-4, redone after the resume
    assert sorted(_scores(resumed.run_dir)) == list(range(1, STEPS + 1))  # each step once
    # a finished run resumed again trains nothing, and says so instead of silently doing zero steps
    records: list[dict[str, object]] = []
    again = RLTrainer(cfg, on_record=records.append).run()
    assert again.steps == STEPS and not [r for r in records if r["kind"] == "step"]
    (note,) = [str(r["note"]) for r in records if r["kind"] == "resume"]
    assert "nothing left to train" in note and "trainer.total_steps" in note
    assert (again.resumed_at, again.steps_this_run, again.total_steps) == (STEPS, 0, STEPS)
    nothing = f"nothing trained this time: {again.run_dir} already holds {STEPS} of {STEPS}"
    assert finished_text(again).startswith(nothing)
    assert (resumed.resumed_at, resumed.steps_this_run) == (2, STEPS - 2)
    assert finished_text(resumed).startswith(f"done: steps 3-{STEPS} of {STEPS} trained now")


def test_resume_refuses_another_world_size_and_a_missing_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cfg = _config(tiny_model_dir, tmp_path, "grpo", "trainer.total_steps=1")
    RLTrainer(cfg).run()
    ckpt = tmp_path / "quartet" / "demo" / "checkpoints" / "global_step_1"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    (ckpt / "trainer_state.json").write_text(json.dumps({**state, "world_size": 2}))
    write_manifest(ckpt, 1)  # as a run of 2 ranks would have written it
    with pytest.raises(CheckpointError, match="written by 2 rank"):
        RLTrainer(cfg).run()
    with pytest.raises(CheckpointError, match="not a checkpoint folder"):
        RLTrainer(_config(tiny_model_dir, tmp_path, "grpo", f"trainer.resume={tmp_path}/nowhere")).run()
