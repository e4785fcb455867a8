"""The engine thread: aborts from another thread, failures, construction from the config."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
from rollout_cases import prompt_ids, shared_model

from quartet.config.rollout import RolloutConfig, SamplingConfig
from quartet.rollout import FinishReason, GenerationRequest, SamplingParams, TorchRolloutEngine


def test_abort_from_another_thread_returns_partial_output(tiny_model_dir: Path) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    with TorchRolloutEngine(shared_model(tiny_model_dir)) as eng:
        request = GenerationRequest(prompt, SamplingParams(max_new_tokens=400, ignore_eos=True, seed=0))
        result: list[object] = []
        worker = threading.Thread(target=lambda: result.extend(eng.generate([request])))
        worker.start()
        deadline = time.monotonic() + 30
        while not eng.core.running and time.monotonic() < deadline:
            time.sleep(0.001)
        eng.abort(request.request_id)
        worker.join(timeout=30)
    out = result[0][0]  # type: ignore[index]
    assert out.finish_reason is FinishReason.ABORT
    assert 1 <= len(out.token_ids) < 400


def test_a_failing_step_fails_its_callers_and_the_engine_recovers(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = GenerationRequest(
        tuple(prompt_ids(tiny_model_dir)[0]), SamplingParams(temperature=0, max_new_tokens=6)
    )
    with TorchRolloutEngine(shared_model(tiny_model_dir)) as eng:
        expected = eng.generate([request])[0][0].token_ids
        original = eng.runner.decode
        calls = {"n": 0}

        def flaky(*args: object, **kwargs: object) -> torch.Tensor:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("boom")
            return original(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(eng.runner, "decode", flaky)
        with pytest.raises(RuntimeError, match="boom"):
            eng.generate([GenerationRequest(request.prompt_token_ids, request.sampling)])
        assert not eng.core.running and len(eng.core.scheduler) == 0
        again = eng.generate([GenerationRequest(request.prompt_token_ids, request.sampling)])[0][0]
    assert again.token_ids == expected


def test_repeated_request_ids_are_rejected_before_anything_runs(tiny_model_dir: Path) -> None:
    request = GenerationRequest((1, 2, 3), SamplingParams(max_new_tokens=2))
    with TorchRolloutEngine(shared_model(tiny_model_dir)) as eng:
        with pytest.raises(ValueError, match="repeat"):
            eng.generate([request, request])
        assert eng.generate([request])[0][0].finish_reason is not None


def test_engine_and_sampling_from_the_rollout_config(tiny_model_dir: Path) -> None:
    cfg = RolloutConfig(max_num_seqs=3, kv_cache_tokens=3 * 40, seed=7)
    with TorchRolloutEngine.from_config(cfg, shared_model(tiny_model_dir)) as eng:
        assert eng.core.max_num_seqs == 3 and eng.core.max_model_len == 40
        params = SamplingParams.from_config(SamplingConfig(temperature=0.5, top_k=4, n=2), max_new_tokens=5)
        assert (params.temperature, params.top_k, params.n, params.max_new_tokens) == (0.5, 4, 2, 5)
        outs = eng.generate([GenerationRequest((5, 6, 7), params)])[0]
    assert len(outs) == 2 and all(len(o.token_ids) <= 5 for o in outs)


def test_num_threads_applies_to_the_engine_thread_only(tiny_model_dir: Path) -> None:
    before = torch.get_num_threads()
    with TorchRolloutEngine(shared_model(tiny_model_dir), num_threads=1) as eng:
        eng.generate([GenerationRequest((1, 2), SamplingParams(max_new_tokens=2))])
    assert torch.get_num_threads() == before


def test_from_pretrained_loads_model_and_tokenizer(tiny_model_dir: Path) -> None:
    with TorchRolloutEngine.from_pretrained(tiny_model_dir, max_num_seqs=2) as eng:
        assert eng.tokenizer is not None and not eng.model.training
        assert eng.tokenizer.eos_token_id in eng.stop_checker.eos_token_ids
        params = SamplingParams(
            max_new_tokens=8, seed=1, stop=("zzz",)
        )  # stop strings work: tokenizer loaded
        out = eng.generate([GenerationRequest((5, 6, 7), params)])[0][0]
    assert 1 <= len(out.token_ids) <= 8
