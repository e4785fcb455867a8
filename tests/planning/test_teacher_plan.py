"""The memory plan counts the distillation teacher: its float32 weights in every phase, where it is
colocated, and its working memory only in its own phase `teacher`; a teacher on a pool of its own with
devices of its own is left out of the main bundle; `quartet plan` prints its rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.cli.main import main
from quartet.config import TinyModelConfig, load_config
from quartet.config.roles import Role
from quartet.models.tiny import ensure_tiny_model
from quartet.planning.estimate import estimate_memory
from quartet.planning.model_shape import HeadKind, shape_from_path
from quartet.planning.plan import Phase


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = TinyModelConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=3)
    return ensure_tiny_model(config, tmp_path_factory.mktemp("teacher"))


def test_the_plan_counts_the_teacher_per_phase(teacher_dir: Path) -> None:
    cfg = load_config(None, [f"teacher.model_path={teacher_dir}", "algorithm.distill_coef=1"])
    plan = estimate_memory(cfg, device="gpu")
    weights = 4 * shape_from_path(str(teacher_dir)).params(HeadKind.CAUSAL_LM)
    rows = {row.phase: row for row in plan.rows if row.role is Role.TEACHER}
    assert set(rows) == set(plan.phases) and Phase.TEACHER in plan.phases
    assert plan.phases.index(Phase.TEACHER) == plan.phases.index(Phase.OLD_LOG_PROB) + 1
    for phase, row in rows.items():
        assert row.breakdown["weights"] == weights
        assert (row.device_bytes > weights) == (phase is Phase.TEACHER)  # working memory in its phase only
    without = estimate_memory(load_config(None, []), device="gpu")
    assert Phase.TEACHER not in without.phases and not any(r.role is Role.TEACHER for r in without.rows)


def test_quartet_plan_prints_the_teacher(teacher_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", f"teacher.model_path={teacher_dir}", "algorithm.distill_coef=1"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    teacher = [cols[0] for cols in lines if len(cols) > 1 and cols[1] == "teacher"]
    assert teacher == ["gen", "old_log_prob", "teacher", "update_actor"]


@pytest.mark.parametrize("fused", [True, False], ids=["fused_head", "plain_head"])
def test_the_plan_counts_gkds_student_side_in_the_update(teacher_dir: Path, fused: bool) -> None:
    """GKD's support log-probs in the actor's update: k gathered weight rows per logit position in bf16
    (twice: saved and their gradient) with the fused head, one more float32 log-softmax without it."""
    overrides = [f"teacher.model_path={teacher_dir}", "algorithm.gkd_coef=1", "algorithm.gkd_top_k=8"]
    overrides.append("actor.mixed_precision=bfloat16")  # 2-byte gathered rows
    cfg = load_config(None, [*overrides, f"model.fused_head={str(fused).lower()}"])
    tiny = TinyModelConfig()  # the default policy
    positions = cfg.actor.micro_batch_size_per_device * (cfg.data.max_response_length + 1)
    expected = 2 * 2 * 8 * tiny.hidden_size * positions if fused else 4 * tiny.vocab_size * positions
    update = [
        r
        for r in estimate_memory(cfg, device="gpu").rows
        if r.role is Role.ACTOR and r.phase is Phase.UPDATE_ACTOR
    ]
    assert [r.breakdown["gkd_support"] for r in update] == [expected]
    off = estimate_memory(load_config(None, [overrides[0], overrides[3]]), device="gpu").rows
    assert not any("gkd_support" in r.breakdown for r in off)
