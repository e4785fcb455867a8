"""Elastic resume through the whole trainer (Ray, world 2): a run trained data parallel (dp2) resumes its
step-2 checkpoint under sequence parallelism (dp1 x sp2), and its step 3 is the uninterrupted run's step 3:
the same prompts and rollouts (the sampler's position is the driver's, and the world size is the same, so
the rollout replicas are too) and the same gradient norm within float tolerance (rel 1e-5: the sequence
split reduces in another order; tests/trainer/loop/test_parallel_trainer_equal.py shows sp2 == dp2 within it
from the start). The resume record names the change of layout.

The setup is test_parallel_trainer_equal.py's (examples/long_context, Adam's eps 1, a digit-share reward).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quartet.config import load_config
from quartet.trainer import RLTrainer

EXAMPLE = Path(__file__).parents[3] / "examples" / "long_context" / "config.yaml"
pytestmark = [pytest.mark.ray, pytest.mark.slow]  # two Ray runs (~40 s on 2 cores)
SAME = ("response_length/mean", "response_length/max", "critic/score/mean", "prompt_length/mean")
REWARD = """
def digit_share(data_source, solution_str, ground_truth, extra_info=None):
    return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))
"""


def _run(folder: Path, reward: Path, sp: int, *extra: str) -> tuple[Path, list[dict[str, Any]]]:
    cfg = load_config(
        str(EXAMPLE),
        [
            f"reward.function={reward}:digit_share",
            f"trainer.output_dir={folder}",
            "trainer.total_steps=3",
            "trainer.save_freq=2",
            "trainer.loggers=[jsonl]",
            "data.max_response_length=256",
            "data.builtin_train_size=16",
            "data.builtin_val_size=4",
            f"model.sequence_parallel_size={sp}",
            "actor.optim.eps=1.0",
            "actor.optim.lr=0.1",
            "cluster.namespace=quartet-tests",  # the shared test cluster's namespace
            *extra,
        ],
    )
    result = RLTrainer(cfg).run()
    assert result.steps == 3
    records = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    return result.run_dir, records


def test_dp2_checkpoint_resumes_under_sp2(ray_cluster: None, tmp_path: Path) -> None:
    reward = tmp_path / "digit_reward.py"
    reward.write_text(REWARD)
    straight_dir, straight = _run(tmp_path / "dp2", reward, 1)
    checkpoint = straight_dir / "checkpoints" / "global_step_2"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["layout"] == {
        "dp": 2,
        "sp": 1,
        "tp": 1,
        "ep": 1,
    }
    _, resumed = _run(tmp_path / "sp2", reward, 2, f"trainer.resume={checkpoint}")
    (note,) = [r["note"] for r in resumed if r["kind"] == "resume"]
    assert "the world changed from 2 rank(s) (dp2) to 2 rank(s) (dp1 x sp2)" in note
    want = next(r for r in straight if r["kind"] == "step" and r["step"] == 3)
    (got,) = [r for r in resumed if r["kind"] == "step"]
    assert got["step"] == 3
    assert {k: got[k] for k in SAME} == {k: want[k] for k in SAME}  # the same prompts and rollouts
    assert want["actor/grad_norm"] > 1e-4
    assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-5)
