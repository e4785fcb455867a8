"""Weight versions in the built-in engine: a load while sequences are in flight lands between two forward
passes, and every generated token is tagged with the version of the weights that computed it.

The in-flight test orders its events itself instead of racing the engine: the engine holds after 5 steps
until the load has begun, then is let go while the load is still copying (so a step that did not wait for
it would run mid-load). On a busy machine the load can no longer miss the generation; it once did: the 60
tokens were all out before the test's thread got to load.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from rollout_cases import prompt_ids, shared_model

from quartet.core.batch import Batch
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.batch_io import outputs_to_batch
from quartet.rollout.types import FinishReason, GenerationOutput


def _fingerprint(model: torch.nn.Module) -> tuple[float, float]:
    """Sums of the first and the last parameter: a load in progress shows as a pair of no version."""
    params = list(model.parameters())
    return float(params[0].detach().double().sum()), float(params[-1].detach().double().sum())


def _slow_stream(
    model: torch.nn.Module, shift: float, started: threading.Event | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's tensors plus `shift`, slowly; `started` is set once the load takes the first one."""
    for name, param in model.named_parameters():
        if started is not None:
            started.set()
        time.sleep(0.003)  # a forward pass that ran mid-load would see the first tensors new, the last old
        yield name, param.detach() + shift


_HANG_GUARD_S = 120.0  # far above what the test takes; only a hang (a bug) ever reaches it


def _hold_after(engine: TorchRolloutEngine, steps: int, release: threading.Event) -> threading.Event:
    """Make the engine wait after `steps` steps until `release` is set; the returned event says it waits.

    It waits where the engine thread asks whether there is work (under the thread's `cond`, outside
    `step_lock`): between two steps, where a load, which takes `step_lock` alone, can run meanwhile.
    """
    held = threading.Event()
    thread: Any = engine._thread
    has_work = thread._has_work

    def has_work_after_release() -> bool:
        if engine.core.steps >= steps and not release.is_set():
            held.set()
            release.wait(_HANG_GUARD_S)
        return bool(has_work())

    thread._has_work = has_work_after_release
    return held


def test_in_flight_load_never_splits_a_forward_pass_and_tags_tokens(tiny_model_dir: Path) -> None:
    model = copy.deepcopy(shared_model(tiny_model_dir))
    engine = TorchRolloutEngine(model, max_num_seqs=8)
    v0 = _fingerprint(model)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.25)
    v1 = _fingerprint(reference)
    seen: list[tuple[tuple[float, float], tuple[float, float]]] = []
    runner: Any = engine.runner
    for name in ("decode", "prefill"):
        original = getattr(runner, name)

        def wrapped(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            before = _fingerprint(model)
            out = _original(*args, **kwargs)
            seen.append((before, _fingerprint(model)))
            return out

        setattr(runner, name, wrapped)
    params = SamplingParams(temperature=1.0, max_new_tokens=60, ignore_eos=True, seed=3, n=2)
    requests = [GenerationRequest(tuple(p), params) for p in prompt_ids(tiny_model_dir)[:4]]
    results: list[list[list[GenerationOutput]]] = []
    load_started = threading.Event()
    held = _hold_after(engine, 5, release=load_started)
    worker = threading.Thread(target=lambda: results.append(engine.generate(requests)))
    try:
        worker.start()
        assert held.wait(_HANG_GUARD_S), "the generation never reached its 5th step"
        # 55 tokens still to come; the engine is let go at the load's first tensor, so it steps again
        # while the load copies: a step that did not wait for the load would show as a split pass
        loaded = engine.load_weights(_slow_stream(model, 0.25, started=load_started), version=1)
        worker.join(_HANG_GUARD_S)
    finally:
        load_started.set()  # a failed assertion above must not leave the engine held
        engine.shutdown()
    assert loaded == len(list(model.parameters()))
    assert engine.weight_version == 1
    # every forward pass ran entirely on one version: before == after, and the pair is a known version
    assert seen and all(before == after for before, after in seen)
    assert {pair for pair, _ in seen} <= {v0, v1}
    assert any(pair == v0 for pair, _ in seen) and any(pair == v1 for pair, _ in seen)
    outputs = [o for per_request in results[0] for o in per_request]
    assert all(o.finish_reason is FinishReason.LENGTH for o in outputs)
    for out in outputs:
        assert out.versions is not None and len(out.versions) == len(out.token_ids)
        assert list(out.versions) == sorted(out.versions)  # a sequence only ever moves to newer weights
        assert set(out.versions) <= {0, 1}
    assert any(set(o.versions or ()) == {0, 1} for o in outputs)  # the load landed mid-sequence


def test_versions_column_follows_the_outputs() -> None:
    prompts = Batch(
        {"prompts": torch.tensor([[5, 6], [0, 7]]), "attention_mask": torch.tensor([[1, 1], [0, 1]])},
        {"uid": ["a", "b"]},
    )
    outs = [
        [GenerationOutput("a", 0, (1, 2, 3), (-1.0, -1.0, -1.0), FinishReason.STOP, versions=(4, 4, 5))],
        [GenerationOutput("b", 0, (9,), (-2.0,), FinishReason.LENGTH, versions=(5,))],
    ]
    batch = outputs_to_batch(prompts, outs, pad_token_id=0, temperature=1.0)
    assert batch["rollout_versions"].tolist() == [[4, 4, 5], [5, 0, 0]]
    untagged = [[GenerationOutput("a", 0, (1,), None, FinishReason.STOP)], outs[1]]
    assert "rollout_versions" not in outputs_to_batch(prompts, untagged, 0, 1.0)


@pytest.mark.parametrize("apply_version", [None, 7])
def test_load_without_version_keeps_the_version(tiny_model_dir: Path, apply_version: int | None) -> None:
    model = copy.deepcopy(shared_model(tiny_model_dir))
    with TorchRolloutEngine(model, max_num_seqs=2) as engine:
        engine.load_weights(list(model.named_parameters()), version=apply_version)
        assert engine.weight_version == (apply_version or 0)
        out = engine.generate([GenerationRequest((5, 6, 7), SamplingParams(max_new_tokens=3, seed=1))])
    assert out[0][0].versions == ((apply_version or 0),) * len(out[0][0].token_ids)
