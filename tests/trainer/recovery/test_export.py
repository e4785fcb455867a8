"""`quartet export`: a checkpoint's policy reloads with `from_pretrained` and gives the trainer's log-probs;
with LoRA, the adapter export over the base model equals the merged export."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from quartet.cli.main import main
from quartet.config import load_config
from quartet.core.batch import Batch, BatchMeta
from quartet.roles.actor import Actor
from quartet.trainer.loop.rl_trainer import RLTrainer
from quartet.trainer.workers.start import run_values

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_local_rank")]

RUN = [
    "cluster.backend=local",
    "data.builtin_train_size=16",
    "data.train_batch_size=4",
    "data.max_response_length=8",
    "rollout.n=2",
    "actor.mini_batch_size=2",
    "actor.micro_batch_size_per_device=2",
    "actor.mixed_precision=float32",
    "actor.optim.lr=1e-2",
    "trainer.test_freq=0",
    "trainer.val_before_train=false",
]


def _tokens(vocab: int) -> Batch:
    g = torch.Generator().manual_seed(7)
    prompts, responses = (
        torch.randint(5, vocab, (3, 6), generator=g),
        torch.randint(5, vocab, (3, 5), generator=g),
    )
    mask = torch.ones(3, 11, dtype=torch.int64)
    columns = {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": mask,
        "response_mask": mask[:, 6:],
    }
    return Batch(columns, meta=BatchMeta(temperature=1.0))


def _hf_logprobs(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """log p(response token t | everything before it), from a plain forward of the loaded model."""
    ids = torch.cat([batch["prompts"], batch["responses"]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
    p = batch["prompts"].shape[1]
    logp = torch.log_softmax(logits[:, p - 1 : -1], dim=-1)
    return logp.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def test_export_reloads_with_the_trainers_logprobs(tiny_model_dir: Path, tmp_path: Path) -> None:
    cfg = load_config(
        None,
        [*RUN, f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "trainer.total_steps=2"],
    )
    result = RLTrainer(cfg).run()
    checkpoint = result.run_dir / "checkpoints" / "global_step_2"
    out = tmp_path / "exported"
    assert main(["export", str(result.run_dir), str(out)]) == 0  # a run folder: its latest checkpoint
    model = AutoModelForCausalLM.from_pretrained(out)
    assert AutoTokenizer.from_pretrained(out).vocab_size > 0
    batch = _tokens(model.config.vocab_size)

    # the trainer's own code path, state from the checkpoint
    trainer_actor = Actor(cfg.actor, run_values(cfg, str(tiny_model_dir)), lora=cfg.model.lora)
    trainer_actor.engine.load(checkpoint / "actor")
    expected = trainer_actor.compute_logprobs(batch)["old_logprobs"]
    assert torch.allclose(_hf_logprobs(model, batch), expected, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    moved = [k for k, v in base.state_dict().items() if not torch.equal(v, model.state_dict()[k])]
    assert moved  # two training steps changed the weights, and the export carries the change
    # the same as the trainer's end-of-run export from the live actor
    final = AutoModelForCausalLM.from_pretrained(result.hf_dir)
    assert torch.allclose(_hf_logprobs(final, batch), expected, atol=1e-5)


def test_lora_adapter_export_equals_merged(tiny_model_dir: Path, tmp_path: Path) -> None:
    peft = pytest.importorskip("peft")
    cfg = load_config(
        None,
        [
            *RUN,
            f"model.path={tiny_model_dir}",
            f"trainer.output_dir={tmp_path}",
            "trainer.total_steps=1",
            "model.lora.rank=4",
            "model.lora.alpha=8",
            "trainer.export_final=false",
        ],
    )
    result = RLTrainer(cfg).run()
    checkpoint = result.run_dir / "checkpoints" / "global_step_1"
    merged, adapter = tmp_path / "merged", tmp_path / "adapter"
    assert main(["export", str(checkpoint), str(merged)]) == 0
    assert main(["export", str(checkpoint), str(adapter), "--lora", "adapter"]) == 0
    assert (adapter / "adapter_config.json").exists() and not (adapter / "model.safetensors").exists()
    assert (adapter / "base_model.txt").read_text().strip() == str(tiny_model_dir)
    merged_model = AutoModelForCausalLM.from_pretrained(merged)
    over_base = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter)
    batch = _tokens(merged_model.config.vocab_size)
    assert torch.allclose(_hf_logprobs(merged_model, batch), _hf_logprobs(over_base, batch), atol=1e-5)


def test_export_refuses_adapter_without_lora_and_a_folder_without_checkpoints(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load_config(
        None,
        [*RUN, f"model.path={tiny_model_dir}", f"trainer.output_dir={tmp_path}", "trainer.total_steps=1"],
    )
    result = RLTrainer(cfg).run()
    assert main(["export", str(result.run_dir), str(tmp_path / "a"), "--lora", "adapter"]) == 1
    assert "without LoRA" in capsys.readouterr().out
    os.makedirs(tmp_path / "empty")
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "b")]) == 1
    assert "not a checkpoint folder" in capsys.readouterr().out
