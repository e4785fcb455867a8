"""The remote teacher (`teacher.url`) against a real quartet server serving the wider tiny teacher: its
log-probs equal the local teacher role's on the same batch; a dead URL, a bad answer and bad config fail
naming what is wrong."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from role_cases import local, rl_batch

from quartet.cluster.colocate import RoleSpec
from quartet.config import ConfigError, Dtype, TinyModelConfig, load_config
from quartet.config.roles import TeacherConfig
from quartet.core.gkd import TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPROBS
from quartet.models.loading import load_causal_lm, load_tokenizer
from quartet.models.tiny import ensure_tiny_model
from quartet.roles.remote_teacher import RemoteTeacher, RemoteTeacherError, row_tokens
from quartet.roles.run_values import RunValues
from quartet.roles.teacher import Teacher
from quartet.rollout import TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread

NAME = "tiny-teacher"


@pytest.fixture(scope="module")
def wide_teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wider, deeper tiny Qwen2 than the policy, with the same tokenizer."""
    config = TinyModelConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=3)
    return ensure_tiny_model(config, tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def teacher_url(wide_teacher: Path) -> Iterator[str]:
    """quartet's server over the built-in engine serving the teacher: its base URL."""
    tokenizer = load_tokenizer(wide_teacher)
    engine = TorchRolloutEngine(load_causal_lm(wide_teacher), tokenizer, max_num_seqs=8, num_threads=1)
    thread = ServerThread(OpenAIServer(engine, tokenizer, NAME, api_key="k", request_timeout_s=60))
    url = thread.start()
    yield url
    thread.stop()
    engine.shutdown()


def _remote(url: str, **kw: object) -> RemoteTeacher:
    return RemoteTeacher(TeacherConfig(url=url, model_name=NAME, api_key="k", tokenizer_path="t", **kw))  # type: ignore[arg-type]


def test_row_tokens_drop_the_padding() -> None:
    batch = rl_batch(4, seed=3)
    rows = row_tokens(batch)
    mask = batch["attention_mask"]
    for i, (prompt, response) in enumerate(rows):
        assert len(prompt) == int(mask[i, :6].sum()) and len(response) == int(mask[i, 6:].sum())
        assert 0 not in prompt and 0 not in response  # rl_batch pads with 0 and draws ids from 10 up


def test_remote_teacher_equals_the_local_role(
    wide_teacher: Path, teacher_url: str, run_values: RunValues, one_local_rank: None
) -> None:
    batch = rl_batch(6, seed=5)
    scored = _remote(teacher_url, max_concurrency=3).score(batch)
    remote = scored["teacher_logprobs"]
    hosts = local(
        teacher=RoleSpec(Teacher, TeacherConfig(model_path=str(wide_teacher)), run_values, Dtype.FLOAT32)
    )
    try:
        local_scored = hosts.groups["teacher"].compute_teacher_logprobs(batch)
    finally:
        hosts.shutdown()
    expected = local_scored["teacher_logprobs"]
    # the server's rank 1 is the local role's argmax (random tokens: mostly disagreement)
    assert torch.equal(scored["teacher_agrees"], local_scored["teacher_agrees"])
    assert remote.shape == expected.shape == batch["responses"].shape
    assert bool((remote[batch["response_mask"] == 0] == 0).all())  # 0 past each response's end
    assert bool((remote[batch["response_mask"] == 1] < 0).all())  # real log-probs where there are tokens
    torch.testing.assert_close(remote, expected.float(), atol=1e-4, rtol=0)


def test_remote_top_k_equals_the_local_role(
    wide_teacher: Path, teacher_url: str, run_values: RunValues, one_local_rank: None
) -> None:
    """GKD's top-k from the server's `prompt_logprobs: k` equals the local teacher's block-wise top-k."""
    batch = rl_batch(4, seed=6)
    remote = RemoteTeacher(
        TeacherConfig(url=teacher_url, model_name=NAME, api_key="k", tokenizer_path="t"), top_k=5
    ).score(batch)
    gkd_run = dataclasses.replace(run_values, gkd_coef=1.0, gkd_top_k=5)
    hosts = local(
        teacher=RoleSpec(Teacher, TeacherConfig(model_path=str(wide_teacher)), gkd_run, Dtype.FLOAT32)
    )
    try:
        expected = hosts.groups["teacher"].compute_teacher_logprobs(batch)
    finally:
        hosts.shutdown()
    model = batch["response_mask"] == 1
    assert remote[TEACHER_TOPK_IDS].shape == (4, batch["responses"].shape[1], 5)
    assert torch.equal(remote[TEACHER_TOPK_IDS][model], expected[TEACHER_TOPK_IDS][model])
    torch.testing.assert_close(
        remote[TEACHER_TOPK_LOGPROBS][model],
        expected[TEACHER_TOPK_LOGPROBS][model].float(),
        atol=1e-4,
        rtol=0,
    )
    # past the server's cap (20, as vLLM's default --max-logprobs): its refusal, named, fails the step
    with pytest.raises(RemoteTeacherError, match=r"row \d+: HTTP 400: .*prompt_logprobs.*got 21"):
        RemoteTeacher(
            TeacherConfig(url=teacher_url, model_name=NAME, api_key="k", tokenizer_path="t"), top_k=21
        ).score(batch)


def test_a_dead_url_fails_naming_it_and_the_row() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(RemoteTeacherError, match=rf"remote teacher {url}, row \d+: no answer"):
        _remote(url, timeout_s=5).score(rl_batch(2))


def test_a_server_refusal_names_the_url_row_and_message(teacher_url: str) -> None:
    batch = rl_batch(2)
    wrong = RemoteTeacher(
        TeacherConfig(url=teacher_url, model_name=NAME, api_key="wrong", tokenizer_path="t")
    )
    with pytest.raises(RemoteTeacherError, match=rf"{teacher_url}, row \d+: HTTP 401.*API key"):
        wrong.score(batch)


def test_remote_teacher_config_is_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"teacher\.url.*teacher\.model_path=/m\) are both set"):
        load_config(None, ["teacher.url=http://h:1/v1", "teacher.model_path=/m", "teacher.tokenizer_path=/t"])
    with pytest.raises(ConfigError, match=r"teacher\.tokenizer_path"):
        load_config(None, ["teacher.url=http://h:1/v1"])
    with pytest.raises(ConfigError, match=r"teacher\.url.*rollout\.temperature=0\.7"):
        load_config(
            None, ["teacher.url=http://h:1/v1", "teacher.tokenizer_path=/t", "rollout.temperature=0.7"]
        )
    cfg = load_config(
        None, ["teacher.url=http://h:1/v1", "teacher.tokenizer_path=/t", "algorithm.distill_coef=1"]
    )
    assert cfg.teacher.enabled and not cfg.teacher.local
