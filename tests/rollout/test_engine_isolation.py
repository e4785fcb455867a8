"""One bad request never harms another in the built-in engine: checks at submission, a failing sequence
fails alone inside a step, and no caller waits forever on a dead engine thread."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
import torch
from rollout_cases import prompt_ids, shared_model

from quartet.rollout import (
    EngineStateError,
    GenerationOutput,
    GenerationRequest,
    InvalidRequestError,
    SamplingParams,
    TorchRolloutEngine,
)

WAIT_S = 60  # a bound on waits that must end: far above the seconds these tests take, so never hit


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[TorchRolloutEngine]:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=8, max_n=16)
    yield eng
    eng.shutdown()


def sampled(seed: int, max_new: int = 12) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_new_tokens=max_new, seed=seed, ignore_eos=True)


def submit_together(
    eng: TorchRolloutEngine, requests: list[GenerationRequest]
) -> list[Future[list[GenerationOutput]]]:
    """Queue the requests so the engine thread takes them in one step (its condition lock is reentrant)."""
    with eng._thread.cond:
        return [eng._submit(r) for r in requests]


def outcome(future: Future[list[GenerationOutput]]) -> list[GenerationOutput] | BaseException:
    try:
        return future.result(timeout=WAIT_S)
    except Exception as exc:
        return exc


def in_thread(call: Callable[[], object]) -> BaseException | object:
    """Run `call` in a helper thread; its result or exception, or a failure if it has not ended in WAIT_S."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(call())
        except BaseException as exc:
            box.append(exc)

    helper = threading.Thread(target=run, daemon=True)
    helper.start()
    helper.join(WAIT_S)
    assert not helper.is_alive(), "the wait hung on a dead engine thread"
    return box[0]


def test_invalid_requests_are_refused_alone_before_joining_the_batch(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    vocab = engine.runner.vocab_size
    good = GenerationRequest(prompt, sampled(1))
    expected = engine.generate([good])[0][0].token_ids
    overflowing = SamplingParams()
    object.__setattr__(overflowing, "top_k", 2**70)  # as if built around __post_init__'s checks
    bad = {
        "prompt_token_ids": [
            GenerationRequest((*prompt, vocab), sampled(2)),
            GenerationRequest((-1, *prompt), sampled(2)),
            GenerationRequest(prompt * 200, sampled(2)),  # longer than the model's context
        ],
        "top_k": [GenerationRequest(prompt, overflowing)],
        "n": [GenerationRequest(prompt, dataclasses.replace(sampled(2), n=17))],  # over max_n
    }

    async def both(request: GenerationRequest) -> list[object]:
        ok = GenerationRequest(prompt, sampled(1))
        return await asyncio.gather(
            engine.generate_one(request), engine.generate_one(ok), return_exceptions=True
        )

    for field, requests in bad.items():
        for request in requests:
            refused, served = asyncio.run(both(request))
            assert isinstance(refused, InvalidRequestError) and refused.field == field, refused
            assert isinstance(served, list) and served[0].token_ids == expected
            with pytest.raises(InvalidRequestError):  # the batch call refuses it before running anything
                engine.generate([GenerationRequest(prompt, sampled(1)), request])
    assert not engine.core.running and len(engine.core.scheduler) == 0


def test_a_sequence_failing_in_decode_fails_its_request_only(
    tiny_model_dir: Path, engine: TorchRolloutEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = prompt_ids(tiny_model_dir)
    goods = [GenerationRequest(tuple(prompts[i]), sampled(10 + i)) for i in (0, 2)]
    alone = [engine.generate([g])[0][0].token_ids for g in goods]
    original = engine.runner.decode

    def poisoned(tokens: torch.Tensor, *args: object) -> torch.Tensor:
        # a test-only fault: any decode batch holding request "bad" past its third token raises
        rows = engine.core.running[: tokens.shape[0]]
        if any(s.request.request_id == "bad" and len(s.token_ids) >= 3 for s in rows):
            raise RuntimeError("poisoned sequence")
        return original(tokens, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine.runner, "decode", poisoned)
    bad = GenerationRequest(tuple(prompts[1]), dataclasses.replace(sampled(5), n=2), request_id="bad")
    # the bad request sits between the good ones, so bisection must tell its slots from their neighbours'
    first, failed, second = (outcome(f) for f in submit_together(engine, [goods[0], bad, goods[1]]))
    assert isinstance(failed, RuntimeError) and "poisoned" in str(failed)
    assert isinstance(first, list) and isinstance(second, list)
    assert [first[0].token_ids, second[0].token_ids] == alone
    assert not engine.core.running and len(engine.core.scheduler) == 0
    again = engine.generate([GenerationRequest(goods[0].prompt_token_ids, sampled(10))])[0][0]
    assert again.token_ids == alone[0]


def test_a_request_failing_in_prefill_fails_alone(
    tiny_model_dir: Path, engine: TorchRolloutEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    good = GenerationRequest(prompt, sampled(4))
    expected = engine.generate([good])[0][0].token_ids
    # let an out-of-vocabulary id past the submission checks: the embedding then raises in the prefill
    monkeypatch.setattr("quartet.rollout.torch.engine_core.check_request", lambda *args: None)
    bad = GenerationRequest((*prompt, engine.runner.vocab_size + 7), sampled(4))
    failed, served = (
        outcome(f) for f in submit_together(engine, [bad, GenerationRequest(prompt, sampled(4))])
    )
    assert isinstance(failed, IndexError)
    assert isinstance(served, list) and served[0].token_ids == expected


class _Fatal(BaseException):
    """Not an Exception: escapes the step's error handling and ends the engine thread."""


def test_waiters_fail_when_the_engine_thread_dies(
    tiny_model_dir: Path, engine: TorchRolloutEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fatal() -> list[object]:
        raise _Fatal("engine thread killed")

    monkeypatch.setattr(engine.core, "step", fatal)
    request = GenerationRequest(tuple(prompt_ids(tiny_model_dir)[0]), sampled(1))
    result = in_thread(lambda: engine.generate([request]))
    assert isinstance(result, EngineStateError) and "died" in str(result)
    assert engine._thread is not None
    engine._thread.join(WAIT_S)
    with pytest.raises(EngineStateError, match="died"):
        engine.generate([GenerationRequest(request.prompt_token_ids, sampled(1))])


@pytest.mark.parametrize("caller", ["generate", "generate_one"])
def test_waits_end_when_the_engine_thread_stops_silently(
    tiny_model_dir: Path, caller: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=2)
    monkeypatch.setattr(eng._thread, "_serve", lambda: None)  # the thread ends at once, settling no future
    request = GenerationRequest(tuple(prompt_ids(tiny_model_dir)[0]), sampled(1))
    if caller == "generate":
        result = in_thread(lambda: eng.generate([request]))
    else:
        result = in_thread(lambda: asyncio.run(eng.generate_one(request)))
    assert isinstance(result, EngineStateError)
    eng.shutdown()


def test_a_cancelled_caller_does_not_stop_the_engine(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    # it finishes (and is settled) while the next request still runs: settling must skip the cancelled future
    future = engine._submit(GenerationRequest(prompt, sampled(3, max_new=2)))
    assert future.cancel()  # pending until the engine settles it, so the cancel always lands
    out = engine.generate([GenerationRequest(prompt, sampled(1))])[0][0]
    assert len(out.token_ids) == 12
    assert engine._thread is not None and engine._thread.is_alive()
