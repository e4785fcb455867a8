"""On-policy distillation through `quartet train` with a remote teacher (`teacher.url`): quartet's own
server serves the wider tiny teacher over HTTP, the driver asks it for every sampled token's log-prob, and
the step's advantages are the reverse-KL signal; a teacher tokenizer other than the policy's is refused
before any worker starts, and a dead URL fails the step naming it."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distill_settings import DISTILL as SHARED
from quartet.config import TinyModelConfig, load_config
from quartet.models.loading import load_causal_lm, load_tokenizer
from quartet.models.tiny import ensure_tiny_model
from quartet.models.tokenizer_match import TokenizerMismatch
from quartet.roles.remote_teacher import RemoteTeacherError
from quartet.rollout import TorchRolloutEngine
from quartet.serving import OpenAIServer, ServerThread
from quartet.trainer import RLTrainer

NAME = "tiny-teacher"
DISTILL = [
    *SHARED,
    "cluster.backend=local",
    f"teacher.model_name={NAME}",
]


@pytest.fixture(scope="module")
def served_teacher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A wider tiny teacher (same tokenizer as the policy) behind quartet's server: (folder, base URL)."""
    folder = ensure_tiny_model(
        TinyModelConfig(hidden_size=96, intermediate_size=192, num_hidden_layers=3),
        tmp_path_factory.mktemp("teacher"),
    )
    tokenizer = load_tokenizer(folder)
    engine = TorchRolloutEngine(load_causal_lm(folder), tokenizer, max_num_seqs=8, num_threads=1)
    thread = ServerThread(OpenAIServer(engine, tokenizer, NAME, request_timeout_s=60))
    url = thread.start()
    yield folder, url
    thread.stop()
    engine.shutdown()


def run(overrides: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    result = RLTrainer(load_config(None, overrides), on_record=records.append).run()
    return result, [r for r in records if r["kind"] == "step"]


@pytest.mark.slow  # ~14 s on the shared 2-core box; the dead-URL test below runs the same path fast
def test_two_steps_with_a_remote_teacher(served_teacher: tuple[Path, str], tmp_path: Path) -> None:
    folder, url = served_teacher
    result, steps = run(
        [*DISTILL, f"teacher.url={url}", f"teacher.tokenizer_path={folder}", f"trainer.output_dir={tmp_path}"]
    )
    assert result.steps == 2 and len(steps) == 2
    for m in steps:
        assert "timing_s/teacher" in m and math.isfinite(m["distill/teacher_logprob"])
        assert m["distill/teacher_logprob"] < 0.0
        assert m["distill/reverse_kl"] != 0.0  # another model: a signal
        # distillation alone, no discount: the mean advantage over model tokens is minus the mean reverse KL
        assert m["critic/advantages/mean"] == pytest.approx(-m["distill/reverse_kl"], rel=1e-4, abs=1e-6)


def test_a_remote_teacher_with_another_tokenizer_is_refused(
    served_teacher: tuple[Path, str], tmp_path: Path
) -> None:
    _, url = served_teacher
    other = ensure_tiny_model(TinyModelConfig(vocab_size=384), tmp_path / "other")
    with pytest.raises(TokenizerMismatch, match=r"the teacher \(.*other.*\) and the policy"):
        run(
            [
                *DISTILL,
                f"teacher.url={url}",
                f"teacher.tokenizer_path={other}",
                f"trainer.output_dir={tmp_path}",
            ]
        )


def test_a_dead_teacher_url_fails_the_step_naming_it(
    served_teacher: tuple[Path, str], tmp_path: Path
) -> None:
    folder, _ = served_teacher
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = f"http://127.0.0.1:{port}/v1"
    overrides = [
        *DISTILL,
        f"teacher.url={dead}",
        f"teacher.tokenizer_path={folder}",
        f"trainer.output_dir={tmp_path}",
    ]
    with pytest.raises(RemoteTeacherError, match=rf"remote teacher {dead}, row 0"):
        run([*overrides, "trainer.total_steps=1", "teacher.timeout_s=5"])
