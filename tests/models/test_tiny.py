"""Tiny models: built here, saved, and loaded back through the real from_pretrained path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification, AutoTokenizer

from quartet.config import TinyArch, TinyModelConfig
from quartet.models.loading import ModelFolderError, load_causal_lm, load_tokenizer, load_value_model
from quartet.models.tiny import EOS_TOKEN, ensure_tiny_model, save_tiny_model, save_value_model


def test_reload_through_from_pretrained_gives_the_same_model(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tok) == TinyModelConfig().vocab_size
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    again = load_causal_lm(tiny_model_dir)
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(p, q), name


def test_forward_backward_and_loss_matches_manual_cross_entropy(tiny_model_dir: Path) -> None:
    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    enc = tok(["What is 12 + 30? The answer is 42."], return_tensors="pt")
    out = model(**enc, labels=enc["input_ids"])
    logits = out.logits[0, :-1]
    manual = torch.nn.functional.cross_entropy(logits, enc["input_ids"][0, 1:])
    assert torch.allclose(out.loss, manual, atol=1e-6)
    out.loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads if g is not None) > 0


def test_training_steps_reduce_loss(tiny_model_dir: Path) -> None:
    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    enc = tok(["The answer is 42.", "The answer is 17."], return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(8):
        loss = model(**enc, labels=labels).loss
        first = first if first is not None else loss.item()
        loss.backward()
        optim.step()
        optim.zero_grad()
    assert loss.item() < first * 0.8


def test_generate_and_chat_template(tiny_model_dir: Path) -> None:
    tok, model = load_tokenizer(tiny_model_dir), load_causal_lm(tiny_model_dir)
    chats = [[{"role": "user", "content": "What is 1 + 2?"}], [{"role": "user", "content": "Hi"}]]
    text = tok.apply_chat_template(chats[0], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    enc = tok.apply_chat_template(
        chats, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    assert (
        tok.padding_side == "left" and enc["attention_mask"][1, 0] == 0
    )  # shorter prompt padded on the left
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=6, do_sample=True)
    assert out.shape[0] == 2 and 0 < out.shape[1] - enc["input_ids"].shape[1] <= 6
    assert model.generation_config.eos_token_id == tok.convert_tokens_to_ids(EOS_TOKEN)


def test_chat_template_renders_tool_calls(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    call = {"name": "calc", "arguments": {"expr": "1+2"}}
    messages = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
        {"role": "tool", "content": "3"},
    ]
    props = {"expr": {"type": "string"}, "base": {"type": "integer"}}
    fn = {"name": "calc", "description": "Adds things up.", "parameters": {"properties": props}}
    tools = [{"type": "function", "function": fn}]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    # one signature per tool; the description is left out (a tiny model cannot read it: tiny.py)
    assert text.startswith("<|im_start|>system\nYou can call these tools:\ncalc(expr, base)\n<|im_end|>\n")
    assert "Adds things up" not in text
    assert '<tool_call>{"name": "calc", "arguments": {"expr": "1+2"}}</tool_call><|im_end|>' in text
    assert text.endswith("<|im_start|>tool\n3<|im_end|>\n")


def test_tokenizer_splits_digits_and_round_trips_text(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    ids = tok("12345", add_special_tokens=False)["input_ids"]
    assert [tok.decode([i]) for i in ids] == ["1", "2", "3", "4", "5"]
    text = "Ünïcode ☃ and 987 − 12 = 975"
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: nothing is unknown
    for special in ("<|im_start|>", "<|im_end|>", "<tool_call>"):
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1


def test_value_model_returns_one_value_per_token(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = save_value_model(tiny_model_dir, tmp_path / "critic")
    critic = AutoModelForTokenClassification.from_pretrained(folder, local_files_only=True)
    tok = load_tokenizer(folder)
    enc = tok(["a b c", "what is 1 + 1"], return_tensors="pt", padding=True)
    values = critic(**enc).logits
    assert values.shape == (*enc["input_ids"].shape, 1)
    policy = load_causal_lm(tiny_model_dir)
    assert torch.equal(critic.model.embed_tokens.weight, policy.model.embed_tokens.weight)  # same trunk
    # Per-token: the value at position t does not depend on later tokens (causal trunk).
    short = tok(["what is"], return_tensors="pt")
    long = tok(["what is 1 + 1"], return_tensors="pt")
    n = short["input_ids"].shape[1]
    critic.eval()
    assert torch.allclose(critic(**short).logits[0], critic(**long).logits[0, :n], atol=1e-5)
    direct = load_value_model(tiny_model_dir)  # straight from the causal LM folder
    assert direct.dropout.p == 0.0 and direct.score.out_features == 1


def test_llama_architecture(tmp_path: Path) -> None:
    spec = TinyModelConfig(arch=TinyArch.LLAMA, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    folder = save_tiny_model(tmp_path / "llama", spec)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.hidden_size == 32


def test_qwen3_moe_architecture_routes_each_token_to_its_experts(tmp_path: Path) -> None:
    spec = TinyModelConfig(
        arch=TinyArch.QWEN3_MOE, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24
    )
    folder = save_tiny_model(tmp_path / "moe", spec)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    block = model.model.layers[0].mlp  # every layer sparse: the fused expert weights [E, 2I, H], [E, H, I]
    assert block.experts.gate_up_proj.shape == (4, 48, spec.hidden_size)
    assert block.experts.down_proj.shape == (4, spec.hidden_size, 24)
    assert all(type(layer.mlp).__name__ == "Qwen3MoeSparseMoeBlock" for layer in model.model.layers)
    hidden = torch.randn(5, spec.hidden_size)
    _, weights, chosen = block.gate(hidden)  # top-2 of 4 per token, weights renormalised to sum to 1
    assert chosen.shape == (5, 2) and torch.allclose(weights.sum(-1), torch.ones(5))
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        TinyModelConfig(arch=TinyArch.QWEN3_MOE, num_experts=2, num_experts_per_tok=3)


def test_same_spec_builds_identical_models(tmp_path: Path) -> None:
    a = load_causal_lm(save_tiny_model(tmp_path / "a"))
    b = load_causal_lm(save_tiny_model(tmp_path / "b"))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()


def test_ensure_tiny_model_builds_once(tmp_path: Path) -> None:
    spec = TinyModelConfig(hidden_size=32)
    first = ensure_tiny_model(spec, tmp_path)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert ensure_tiny_model(spec, tmp_path) == first
    assert (first / "config.json").stat().st_mtime_ns == stamp
    assert ensure_tiny_model(TinyModelConfig(hidden_size=48), tmp_path) != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".building-")]


def test_loading_never_downloads(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match="does not download"):
        load_causal_lm("Qwen/Qwen2.5-0.5B")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFolderError, match="no config.json"):
        load_causal_lm(tmp_path / "empty")
