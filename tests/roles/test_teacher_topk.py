"""The teacher role's per-position outputs against transformers' own logits: `teacher_agrees` is 1 exactly
where the teacher's most likely token is the sampled one (on model-written tokens only), and with GKD on its
top-k ids and log-probs are those of a full log-softmax."""

from __future__ import annotations

from pathlib import Path

import torch
from role_cases import rl_batch

from gkd_cases import TEMPERATURE, full_logprobs
from quartet.config.model import Dtype
from quartet.config.roles import TeacherConfig
from quartet.core.batch import Batch
from quartet.core.gkd import TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPROBS
from quartet.roles.run_values import RunValues
from quartet.roles.teacher import Teacher


def teacher(model_dir: Path, gkd_coef: float, remove_padding: bool = False) -> Teacher:
    run = RunValues(
        str(model_dir), 16, 8, 4, 2, gkd_coef=gkd_coef, gkd_top_k=3, remove_padding=remove_padding
    )
    return Teacher(TeacherConfig(model_path=str(model_dir)), run, Dtype.FLOAT32)


def scored_batch(model_dir: Path) -> Batch:
    """Rows whose responses are the model's own argmax at some positions and random tokens at others, with
    a tool turn (response_mask 0) in row 1."""
    batch = rl_batch(3, prompt_len=10, response_len=6, seed=7).with_meta(temperature=TEMPERATURE)
    responses = batch["responses"].clone()
    for _ in range(6):  # greedy continuation position by position: every even position takes the argmax
        reference = full_logprobs(
            model_dir, Batch({**batch.columns(), "responses": responses}, meta=batch.meta)
        )
        for i, logp in enumerate(reference):
            for t in range(0, logp.shape[0], 2):
                responses[i, t] = int(logp[t].argmax())
    mask = batch["response_mask"].clone()
    mask[1, 2:4] = 0  # a tool turn: no teacher agreement counted there
    return Batch({**batch.columns(), "responses": responses, "response_mask": mask}, meta=batch.meta)


def test_agreement_is_the_argmax_of_the_full_softmax_on_model_tokens(tiny_model_dir: Path) -> None:
    batch = scored_batch(tiny_model_dir)
    got = teacher(tiny_model_dir, 0.0).compute_teacher_logprobs(batch)
    assert TEACHER_TOPK_IDS not in got  # without GKD only the top-1 is computed, and not shipped
    expected = torch.zeros_like(got["teacher_agrees"])
    for i, logp in enumerate(full_logprobs(tiny_model_dir, batch)):
        for t in range(logp.shape[0]):
            expected[i, t] = float(
                int(logp[t].argmax()) == int(batch["responses"][i, t]) and batch["response_mask"][i, t] > 0
            )
    assert torch.equal(got["teacher_agrees"], expected)
    assert 0 < float(expected.sum()) < float(batch["response_mask"].sum())  # both cases occur


def test_gkd_ships_the_top_k(tiny_model_dir: Path) -> None:
    batch = scored_batch(tiny_model_dir)
    got = teacher(tiny_model_dir, 1.0).compute_teacher_logprobs(batch)
    ids, values = got[TEACHER_TOPK_IDS], got[TEACHER_TOPK_LOGPROBS]
    assert ids.shape == values.shape == (3, 6, 3)
    for i, logp in enumerate(full_logprobs(tiny_model_dir, batch)):
        top = logp.topk(3, dim=-1)
        assert torch.equal(ids[i, : logp.shape[0]], top.indices)
        torch.testing.assert_close(values[i, : logp.shape[0]].double(), top.values, atol=2e-5, rtol=0)


def test_a_packed_teacher_scores_without_the_agreement(tiny_model_dir: Path) -> None:
    """Top-k is built for the padded head: a teacher on packed passes (`model.remove_padding`, or SP) still
    scores every token, equal to the padded teacher's, and leaves the agreement metric out."""
    batch = scored_batch(tiny_model_dir)
    packed = teacher(tiny_model_dir, 0.0, remove_padding=True).compute_teacher_logprobs(batch)
    padded = teacher(tiny_model_dir, 0.0).compute_teacher_logprobs(batch)
    assert "teacher_agrees" not in packed and "teacher_agrees" in padded
    torch.testing.assert_close(packed["teacher_logprobs"], padded["teacher_logprobs"], atol=1e-5, rtol=0)
