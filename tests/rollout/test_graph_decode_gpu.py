"""On a CUDA device: decode steps replayed from CUDA graphs generate what eager steps do, see weight
updates without a new capture, and are captured again after the weights move (sleep and wake)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rollout_cases import prompt_ids, varied_model

from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

BUDGETS = [40, 7, 23, 12, 40]


def _generate(engine: TorchRolloutEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_new_tokens=b, ignore_eos=True) for b in BUDGETS]
    outs = engine.generate([GenerationRequest(tuple(p), s) for p, s in zip(prompts, params, strict=True)])
    return [list(o[0].token_ids) for o in outs]


def test_graphed_decoding_matches_eager_and_follows_weights(tiny_model_dir: Path) -> None:
    prompts = prompt_ids(tiny_model_dir)
    eager_model = varied_model(tiny_model_dir).cuda()
    graph_model = varied_model(tiny_model_dir).cuda()
    with (
        TorchRolloutEngine(eager_model, max_num_seqs=4, cuda_graphs=False) as eager,
        TorchRolloutEngine(graph_model, max_num_seqs=4, cuda_graphs=True) as graphed,
    ):
        decoder = graphed.core.decoder
        assert eager.core.decoder is None and decoder is not None
        assert _generate(graphed, prompts) == _generate(eager, prompts)
        captured = decoder.captures
        assert 1 < captured <= len(decoder.row_buckets) * 2  # bounded: rows x length buckets used
        # a weight update copies into the captured tensors: no new capture, new outputs
        update = [(n, p.detach() * 0.9) for n, p in varied_model(tiny_model_dir, seed=1).named_parameters()]
        eager.load_weights(update)
        graphed.load_weights(update)
        assert _generate(graphed, prompts) == _generate(eager, prompts)
        assert decoder.captures == captured
        # sleep with the weights on the host and wake: new addresses, so new captures
        graphed.sleep(offload_weights=True)
        graphed.wake()
        assert _generate(graphed, prompts) == _generate(eager, prompts)
        assert decoder.captures > captured


def test_sampling_inside_the_graph_matches_sampling_after_it(tiny_model_dir: Path) -> None:
    """Seeded sampling, with and without top-k/top-p: the graphed engine samples plain batches inside
    each replay, the eager engine after its logits; tokens equal, log-probs within float32 rounding."""
    prompts = prompt_ids(tiny_model_dir)
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=b, seed=i, ignore_eos=True, top_k=20 * (i % 2))
        for i, b in enumerate(BUDGETS)
    ]
    requests = [GenerationRequest(tuple(p), s) for p, s in zip(prompts, params, strict=True)]
    with (
        TorchRolloutEngine(varied_model(tiny_model_dir).cuda(), max_num_seqs=4, cuda_graphs=False) as eager,
        TorchRolloutEngine(varied_model(tiny_model_dir).cuda(), max_num_seqs=4, cuda_graphs=True) as graphed,
    ):
        want = [o[0] for o in eager.generate(requests)]
        got = [o[0] for o in graphed.generate(requests)]
        decoder = graphed.core.decoder
        assert decoder is not None and any(len(key) > 2 for key in decoder._buckets)  # sampled inside
    for g, w in zip(got, want, strict=True):
        assert list(g.token_ids) == list(w.token_ids)
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)


def test_blocks_of_tokens_per_replay_match_eager_decoding(tiny_model_dir: Path) -> None:
    """`rollout.graph_decode_steps=4`: each replay decodes 4 tokens a row (budgets end inside blocks)."""
    prompts = prompt_ids(tiny_model_dir)
    params = [
        SamplingParams(temperature=1.0, max_new_tokens=b, seed=i, ignore_eos=True)
        for i, b in enumerate(BUDGETS)
    ]
    requests = [GenerationRequest(tuple(p), s) for p, s in zip(prompts, params, strict=True)]
    with (
        TorchRolloutEngine(varied_model(tiny_model_dir).cuda(), max_num_seqs=4, cuda_graphs=False) as eager,
        TorchRolloutEngine(
            varied_model(tiny_model_dir).cuda(), max_num_seqs=4, cuda_graphs=True, graph_decode_steps=4
        ) as graphed,
    ):
        want = [o[0] for o in eager.generate(requests)]
        got = [o[0] for o in graphed.generate(requests)]
        decoder = graphed.core.decoder
        assert decoder is not None and any(key[-1] == 4 for key in decoder._buckets)
    for g, w in zip(got, want, strict=True):
        assert list(g.token_ids) == list(w.token_ids)
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5, rtol=0)
