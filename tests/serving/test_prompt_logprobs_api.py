"""`prompt_logprobs` on `/v1/completions` (vLLM's parameter), through the official `openai` client against
the real server over the built-in engine: the numbers are checked against a plain torch forward of the
same model (log_softmax recomputed here), the layout against vLLM's, and bad input against 400s."""

from __future__ import annotations

from typing import Any

import openai
import pytest
import torch
from serving_cases import MODEL_NAME, client
from transformers import PreTrainedTokenizerBase

from quartet.rollout import TorchRolloutEngine
from quartet.rollout.torch import prompt_scores
from quartet.serving import OpenAIServer, ServerThread

Served = tuple[OpenAIServer, ServerThread, str]


def _reference(engine: TorchRolloutEngine, prompt: list[int]) -> torch.Tensor:
    """log_softmax of the model's logits at every prompt position [P, V] (temperature 1)."""
    model: Any = engine.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


@pytest.mark.parametrize("chunk", [512, 4])  # 4: the head runs over the prompt in three pieces
def test_prompt_logprobs_equal_a_torch_forward(
    served: Served,
    serving_engine: TorchRolloutEngine,
    serving_tokenizer: PreTrainedTokenizerBase,
    monkeypatch: pytest.MonkeyPatch,
    chunk: int,
) -> None:
    monkeypatch.setattr(prompt_scores, "CHUNK", chunk)
    _, _, url = served
    prompt = [5, 17, 99, 3, 250, 17, 42, 8, 301, 77]
    k = 3
    out = client(url).completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=1,
        temperature=0.7,  # the scores are the raw model's (T = 1) whatever the sampling temperature
        extra_body={"prompt_logprobs": k},
    )
    [choice] = out.model_dump()["choices"]
    scores = choice["prompt_logprobs"]
    ref = _reference(serving_engine, prompt)
    assert len(scores) == len(prompt) and scores[0] is None
    for t in range(1, len(prompt)):
        entry = scores[t]
        row = ref[t - 1]
        token = prompt[t]
        expected_top = row.topk(k).indices.tolist()
        assert set(entry) == {str(i) for i in [token, *expected_top]}  # the token plus the top k, no more
        got = entry[str(token)]
        assert got["logprob"] == pytest.approx(float(row[token]), abs=1e-4)
        assert got["rank"] == int((row > row[token]).sum()) + 1
        assert got["decoded_token"] == serving_tokenizer.decode([token])
        for rank, i in enumerate(expected_top, 1):
            assert entry[str(i)]["logprob"] == pytest.approx(float(row[i]), abs=1e-4)
            assert entry[str(i)]["rank"] == rank


def test_prompt_logprobs_zero_gives_the_token_alone(
    served: Served, serving_engine: TorchRolloutEngine
) -> None:
    _, _, url = served
    prompt = [11, 12, 13, 14]
    out = client(url).completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=1, n=2, extra_body={"prompt_logprobs": 0}
    )
    first, second = out.model_dump()["choices"]
    assert first["prompt_logprobs"] == second["prompt_logprobs"]  # one prompt, scored once, for each sample
    scores = first["prompt_logprobs"]
    ref = _reference(serving_engine, prompt)
    assert scores[0] is None
    got = [float(scores[t][str(prompt[t])]["logprob"]) for t in range(1, len(prompt))]
    assert [len(s) for s in scores[1:]] == [1, 1, 1]
    assert got == pytest.approx([float(ref[t - 1, prompt[t]]) for t in range(1, len(prompt))], abs=1e-4)
    plain = client(url).completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1)
    assert "prompt_logprobs" not in plain.model_dump()["choices"][0]  # only when asked


@pytest.mark.parametrize("bad", [21, -1, "2", True])
def test_a_bad_prompt_logprobs_is_a_400_naming_it(served: Served, bad: object) -> None:
    _, _, url = served
    with pytest.raises(openai.BadRequestError) as err:
        client(url).completions.create(
            model=MODEL_NAME, prompt=[1, 2, 3], max_tokens=1, extra_body={"prompt_logprobs": bad}
        )
    assert err.value.body["param"] == "prompt_logprobs"  # type: ignore[index]


def test_a_prompt_past_the_context_is_a_400_naming_the_prompt(
    served: Served, serving_engine: TorchRolloutEngine
) -> None:
    _, _, url = served
    context = int(serving_engine.model.config.max_position_embeddings)  # type: ignore[union-attr]
    with pytest.raises(openai.BadRequestError) as err:
        client(url).completions.create(
            model=MODEL_NAME, prompt=[7] * context, max_tokens=1, extra_body={"prompt_logprobs": 0}
        )
    assert err.value.body["param"] == "prompt"  # type: ignore[index]
    assert "max_model_len" in str(err.value)
