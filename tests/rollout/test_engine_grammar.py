"""Constrained decoding in the built-in engine (`SamplingParams.grammar`), against independent references.

The reference of a greedy constrained decoding is a slow loop: a full forward per token, and the allowed
tokens read from llguidance's byte-per-token logit bias (`compute_logit_bias`), not from the bitmask the
engine unpacks; every chosen token is checked to be one the matcher accepts.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
import torch
from llguidance import LLMatcher
from rollout_cases import prompt_ids, recompute_logits, shared_model, tokenizer, varied_model

from quartet.rollout import FinishReason, GenerationRequest, SamplingParams, TorchRolloutEngine
from quartet.rollout.torch.grammar import GrammarCompiler
from quartet.rollout.validation import InvalidRequestError

CODE = r"[a-z]{2,4}-[0-9]{2}"
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "integer", "minimum": 0, "maximum": 99},
        "unit": {"enum": ["cm", "m", "km"]},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "unit", "ok"],
    "additionalProperties": False,
}


@pytest.fixture
def engine(tiny_model_dir: Path) -> Iterator[TorchRolloutEngine]:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), tokenizer(tiny_model_dir), max_num_seqs=8)
    yield eng
    eng.shutdown()


def test_a_grammar_shapes_every_sample_and_leaves_its_batch_neighbours_alone(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    tok = tokenizer(tiny_model_dir)
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    grammar = LLMatcher.grammar_from_regex(CODE)
    plain = SamplingParams(temperature=0, max_new_tokens=10, ignore_eos=True)
    alone = engine.generate([GenerationRequest(prompt, plain)])[0][0]
    constrained = SamplingParams(temperature=1.0, n=3, seed=5, max_new_tokens=20, grammar=grammar)
    outs, beside = engine.generate([GenerationRequest(prompt, constrained), GenerationRequest(prompt, plain)])
    assert beside[0].token_ids == alone.token_ids  # the unconstrained neighbour is untouched
    texts = []
    for out in outs:
        text = tok.decode(list(out.token_ids))
        texts.append(text)
        assert re.fullmatch(CODE, text), text
        # the grammar ends the response (after 2 digits nothing else can follow): no stop token needed
        assert out.finish_reason is FinishReason.STOP and out.stop_reason is None
    assert len(set(texts)) > 1  # the samples differ: the mask does not collapse sampling


def slow_constrained_greedy(
    tiny_model_dir: Path, prompt: list[int], grammar: str, max_new: int
) -> tuple[list[int], list[float]]:
    """Greedy decoding over the tokens llguidance's logit bias allows at each step."""
    tok = tokenizer(tiny_model_dir)
    from llguidance.hf import from_tokenizer

    matcher = LLMatcher(from_tokenizer(tok, n_vocab=len(tok)), grammar, log_level=0)
    tokens: list[int] = []
    logprobs: list[float] = []
    model = shared_model(tiny_model_dir)
    while len(tokens) < max_new and not matcher.is_stopped():
        logits = recompute_logits(model, prompt, [*tokens, 0])[-1].tolist()
        allowed = [t for t, b in enumerate(matcher.compute_logit_bias()[: len(tok)]) if b]
        assert allowed, matcher.get_error()
        best = max(allowed, key=lambda t: logits[t])
        norm = math.log(sum(math.exp(logits[t]) for t in allowed))
        tokens.append(best)
        logprobs.append(logits[best] - norm)
        assert matcher.consume_token(best)
    return tokens, logprobs


def test_greedy_constrained_decoding_matches_the_slow_loop(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = prompt_ids(tiny_model_dir)[1]
    grammar = LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})
    ref_tokens, ref_logprobs = slow_constrained_greedy(tiny_model_dir, prompt, grammar, 40)
    params = SamplingParams(temperature=0, max_new_tokens=40, grammar=grammar)
    [out] = engine.generate([GenerationRequest(tuple(prompt), params)])[0]
    assert list(out.token_ids) == ref_tokens
    assert out.logprobs == pytest.approx(ref_logprobs, abs=1e-4)
    value = json.loads(tokenizer(tiny_model_dir).decode(list(out.token_ids)))
    jsonschema.validate(value, SCHEMA)


def test_a_grammar_completed_on_the_last_allowed_token_is_a_stop(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    params = SamplingParams(max_new_tokens=1, n=2, grammar=LLMatcher.grammar_from_regex("[0-9]"))
    for out in engine.generate([GenerationRequest(prompt, params)])[0]:
        assert out.finish_reason is FinishReason.STOP
        assert tokenizer(tiny_model_dir).decode(list(out.token_ids)).isdigit()


def test_a_grammar_that_does_not_compile_fails_its_request_only(
    tiny_model_dir: Path, engine: TorchRolloutEngine
) -> None:
    prompt = tuple(prompt_ids(tiny_model_dir)[0])
    bad = SamplingParams(max_new_tokens=4, grammar=LLMatcher.grammar_from_lark("start: undefined_rule"))
    with pytest.raises(InvalidRequestError, match="grammar"):
        engine.generate([GenerationRequest(prompt, bad)])
    [ok] = engine.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=3, ignore_eos=True))])[0]
    assert len(ok.token_ids) == 3


def test_an_engine_without_tokenizer_refuses_grammars(tiny_model_dir: Path) -> None:
    eng = TorchRolloutEngine(shared_model(tiny_model_dir), max_num_seqs=2)
    try:
        params = SamplingParams(max_new_tokens=4, grammar=LLMatcher.grammar_from_regex("a"))
        with pytest.raises(InvalidRequestError, match="tokenizer"):
            eng.generate([GenerationRequest(tuple(prompt_ids(tiny_model_dir)[0]), params)])
    finally:
        eng.shutdown()


def test_the_compiler_caches_and_hands_out_independent_matchers(tiny_model_dir: Path) -> None:
    tok = tokenizer(tiny_model_dir)
    compiler = GrammarCompiler(tok, len(tok))
    grammar = LLMatcher.grammar_from_regex("ab")
    first, second = compiler.matcher(grammar), compiler.matcher(grammar)
    [a] = tok.encode("a", add_special_tokens=False)
    assert first.consume_token(a)
    assert not first.is_stopped() and second.deep_copy().consume_token(a)  # second is still at the start
    with pytest.raises(InvalidRequestError):
        SamplingParams(grammar="  ")


def test_a_batch_without_grammar_never_reaches_the_mask(
    tiny_model_dir: Path, engine: TorchRolloutEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import quartet.rollout.torch.engine_core as core_module

    def refuse(*_: object) -> None:
        raise AssertionError("the grammar mask ran for an unconstrained batch")

    monkeypatch.setattr(core_module, "apply_grammar_masks", refuse)
    prompts = prompt_ids(tiny_model_dir)[:3]
    params = SamplingParams(temperature=1.0, n=2, max_new_tokens=6, ignore_eos=True)
    outs = engine.generate([GenerationRequest(tuple(p), params) for p in prompts])
    assert all(len(o.token_ids) == 6 for group in outs for o in group)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_constrained_decoding_on_cuda_with_graphed_decode_steps(tiny_model_dir: Path) -> None:
    """The mask applies after the graphed forward: the same tokens as eager decoding on the same device."""
    prompt = tuple(prompt_ids(tiny_model_dir)[1])
    grammar = LLMatcher.grammar_from_json_schema(SCHEMA, overrides={"whitespace_flexible": False})
    params = SamplingParams(temperature=0, max_new_tokens=40, grammar=grammar)
    plain = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    tok = tokenizer(tiny_model_dir)
    with (
        TorchRolloutEngine(
            varied_model(tiny_model_dir).cuda(), tok, max_num_seqs=4, cuda_graphs=False
        ) as eager,
        TorchRolloutEngine(varied_model(tiny_model_dir).cuda(), tok, max_num_seqs=4, cuda_graphs=True) as gpu,
    ):
        assert gpu.core.decoder is not None
        requests = [GenerationRequest(prompt, params), GenerationRequest(prompt, plain)]
        on_gpu = [o[0].token_ids for o in gpu.generate(requests)]
        on_eager = [o[0].token_ids for o in eager.generate(requests)]
    assert on_gpu == on_eager
    jsonschema.validate(json.loads(tok.decode(list(on_gpu[0]))), SCHEMA)


def test_the_vllm_engine_refuses_a_grammar() -> None:
    """vLLM's own structured outputs are not wired: a grammar is refused before it reaches vLLM (the check
    runs without vLLM installed)."""
    from types import SimpleNamespace

    from quartet.rollout.vllm_engine import VLLMRolloutEngine

    params = SamplingParams(max_new_tokens=4, grammar=LLMatcher.grammar_from_regex("a"))
    fake = SimpleNamespace(has_tokenizer=True, max_model_len=64)
    with pytest.raises(ValueError, match="built-in engine only"):
        VLLMRolloutEngine._validate(fake, GenerationRequest((1, 2), params))  # type: ignore[arg-type]
    VLLMRolloutEngine._validate(fake, GenerationRequest((1, 2), SamplingParams(max_new_tokens=4)))  # type: ignore[arg-type]
