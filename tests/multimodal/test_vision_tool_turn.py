"""A later turn that brings an image (a tool's result): the rollout engine prefills the whole history with
both images, and the trainer reads the tool turn's image tokens (response_mask 0) as image slots, so its
log-probs of both assistant turns equal the engine's (fp32), while a sampled `<|image_pad|>` stays a token."""

from __future__ import annotations

from pathlib import Path

import torch
from vision_cases import png

from quartet.config.model import Dtype
from quartet.core.batch import Batch
from quartet.data.images import ImageInputs, expand_image_tokens
from quartet.engines import EngineSpec, MicroSpec, ModelKind, TrainingEngine
from quartet.models.loading import load_causal_lm, load_image_processor, load_tokenizer
from quartet.rollout import GenerationRequest, SamplingParams, TorchRolloutEngine


def _render(tokenizer: object, messages: list[dict[str, object]], generation: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        messages, add_generation_prompt=generation, tokenize=True, return_dict=False
    )
    return [int(t) for t in ids]


def test_tool_image_turn(tiny_vlm_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_vlm_dir)
    images = ImageInputs.of(load_image_processor(tiny_vlm_dir), tokenizer)
    pad = images.image_token_id
    first, second = png("red"), png("blue", (112, 56), "ellipse")
    user = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Look closer."}]}]
    prompt = expand_image_tokens(_render(tokenizer, user, True), pad, [images.tokens_per_image(64, 64)], "p")
    engine = TorchRolloutEngine(load_causal_lm(tiny_vlm_dir), tokenizer, max_num_seqs=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11, ignore_eos=True)
    try:
        one = engine.generate([GenerationRequest(tuple(prompt), params, multi_modal=images.process([first]))])
        turn1 = list(one[0][0].token_ids) + [pad]  # the model "samples" an image pad: a plain token
        # the tool's turn: its text and a new image as the chat template renders them, then the next prompt
        tool = [{"role": "tool", "content": [{"type": "text", "text": "zoomed:"}, {"type": "image"}]}]
        tool_ids = _render(tokenizer, tool, True)
        tool_ids = expand_image_tokens(tool_ids, pad, [images.tokens_per_image(112, 56)], "tool")
        history = prompt + turn1 + tool_ids
        both = images.process([first, second])
        slots = [t == pad for t in prompt] + [False] * len(turn1) + [t == pad for t in tool_ids]
        request = GenerationRequest(tuple(history), params, multi_modal={**both, "image_mask": slots})
        two = engine.generate([request])
    finally:
        engine.shutdown()
    turn2 = list(two[0][0].token_ids)
    response = turn1 + tool_ids + turn2
    mask = [1] * len(turn1) + [0] * len(tool_ids) + [1] * len(turn2)
    rollout = list(one[0][0].logprobs or []) + [0.0] + [0.0] * len(tool_ids) + list(two[0][0].logprobs or [])
    batch = Batch(
        {
            "prompts": torch.tensor([prompt]),
            "responses": torch.tensor([response]),
            "response_mask": torch.tensor([mask]),
            "attention_mask": torch.ones(1, len(prompt) + len(response), dtype=torch.int64),
        },
        {"multi_modal_inputs": [both]},
    )
    trainer = TrainingEngine(EngineSpec(str(tiny_vlm_dir), ModelKind.CAUSAL_LM, Dtype.FLOAT32))
    logprobs, _ = trainer.forward_logprobs(batch, 1.0, MicroSpec(size=1))
    check = torch.tensor(mask, dtype=torch.bool)
    check[len(turn1) - 1] = False  # the pad appended by hand has no engine log-prob
    diff = (logprobs[0] - torch.tensor(rollout)).abs()[check]
    assert check.sum() == 2 * 6 and float(diff.max()) <= 1e-5
    assert response.count(pad) == 1 + images.tokens_per_image(112, 56)  # one sampled, the rest the tool's
