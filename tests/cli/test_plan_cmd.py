"""`quartet plan` on the presets: it names the model it planned, warns when a GPU config names none, and
plans a GPU config from a machine without CUDA through `--gpu NAME` (a card's nominal memory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quartet.cli.main import main
from quartet.config import load_config

SINGLE_GPU = "examples/single_gpu/config.yaml"  # cluster.device gpu, no model.path, model.tiny unset
SINGLE_GPU_SYNC = "examples/single_gpu/sync.yaml"  # a GPU config that sets model.tiny (a 0.36B shape)
SINGLE_CPU = "examples/single_cpu/config.yaml"  # a CPU config with a tiny model of its own
GiB = 2**30
PRESET_NOTE = "this GPU config names no model"

QWEN25_05B = {  # Qwen2.5-0.5B-Instruct's config.json, the shape the single_gpu preset's comment suggests
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's case (a CPU box), on any machine."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qwen2.5-0.5b")
    (folder / "config.json").write_text(json.dumps(QWEN25_05B))
    return folder


def _plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["plan", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


class _Vocabulary:
    """What `build_tiny_causal_lm` reads of a tokenizer: its length and two token ids."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.eos_token_id = 1
        self.pad_token_id = 0

    def __len__(self) -> int:
        return self.size


def _tiny_params(config: str) -> int:
    """Parameters of the tiny model the code builds for `config` (transformers' own count), at the vocabulary
    size the planner assumes (`model.tiny.vocab_size`)."""
    from quartet.models.tiny import build_tiny_causal_lm

    spec = load_config(config).model.tiny
    model = build_tiny_causal_lm(spec, _Vocabulary(spec.vocab_size))  # type: ignore[arg-type]
    return sum(p.numel() for p in model.parameters())


# ---- which model was planned ------------------------------------------------------------------------------


def test_a_gpu_preset_without_a_model_names_the_tiny_model_and_says_so(
    no_cuda: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", SINGLE_GPU, "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    params = _tiny_params(SINGLE_GPU)
    assert params == 107_072  # hidden 64, 2 layers, vocabulary 512, tied head: the TinyModelConfig defaults
    first = out.splitlines()[0]
    assert (
        first
        == f"model: the built-in tiny model (model.tiny: qwen2, hidden 64, 2 layers, {params:,} parameters)"
    )
    last = out.strip().splitlines()[-1]  # the note comes after the verdict, where it is read
    assert last.startswith(f"note: {PRESET_NOTE}") and "model.path=DIR" in last
    assert "say nothing about the memory of a real one" in last


def test_the_json_names_the_model_and_carries_the_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _plan_json(capsys, SINGLE_GPU, "--gpu", "h100")
    assert code == 0
    assert out["model"]["path"] is None
    assert out["model"]["params"] == _tiny_params(SINGLE_GPU)
    assert out["model"]["name"].startswith("the built-in tiny model (model.tiny: qwen2, hidden 64, 2 layers")
    assert out["model"]["note"].startswith(PRESET_NOTE)


def test_a_model_folder_is_named_and_gets_no_note(
    qwen_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):  # transformers' own count of the same config, no memory
        built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(qwen_folder))
    params = sum(p.numel() for p in built.parameters())
    assert params == 494_032_768  # Qwen2.5-0.5B's published size
    code, out = _plan_json(capsys, SINGLE_GPU, f"model.path={qwen_folder}", "--gpu", "h100")
    assert code == 0
    assert out["model"] == {
        "name": f"{qwen_folder} (qwen2, {params:,} parameters)",
        "path": str(qwen_folder),
        "params": params,
        "active_params": params,  # a dense model computes with all of them
        "note": None,
    }
    main(["plan", SINGLE_GPU, f"model.path={qwen_folder}", "--gpu", "h100"])
    text = capsys.readouterr().out
    assert text.splitlines()[0] == f"model: {qwen_folder} (qwen2, {params:,} parameters)"
    assert PRESET_NOTE not in text


def test_a_gpu_config_that_chose_its_tiny_model_gets_no_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _plan_json(capsys, SINGLE_GPU_SYNC, "--gpu", "h100")
    assert code in (0, 3)
    assert out["model"]["note"] is None
    assert "hidden 896, 24 layers" in out["model"]["name"]
    assert out["model"]["params"] == _tiny_params(SINGLE_GPU_SYNC)


def test_cpu_plans_of_the_tiny_model_get_no_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", SINGLE_CPU, "--memory-gib", "16"]) == 0
    out = capsys.readouterr().out
    params = _tiny_params(SINGLE_CPU)
    assert out.splitlines()[0] == (
        f"model: the built-in tiny model (model.tiny: qwen2, hidden 128, 4 layers, {params:,} parameters)"
    )
    assert PRESET_NOTE not in out
    # the defaults (the default tiny model) planned on a CPU: the normal case, no note either
    code, plan = _plan_json(capsys, "cluster.device=cpu", "--memory-gib", "16")
    assert code == 0 and plan["model"]["note"] is None and plan["plan"]["device"] == "cpu"


def test_a_gpu_preset_planned_on_cpu_still_gets_the_note(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _plan_json(capsys, SINGLE_GPU, "--device", "cpu", "--memory-gib", "16")
    assert code == 0 and out["plan"]["device"] == "cpu"
    assert out["model"]["note"].startswith(PRESET_NOTE)  # cluster.device is gpu: the preset is a GPU's


# ---- --gpu NAME -------------------------------------------------------------------------------------------

NOMINAL = {"h100": 80, "h200": 141, "a100-80g": 80, "a100-40g": 40, "l40s": 48, "a10g": 24, "t4": 16}
"""The cards' nominal memory in GiB, written out here (not read from planning.gpus)."""


@pytest.mark.parametrize(("name", "gib"), sorted(NOMINAL.items()))
def test_gpu_plans_for_the_cards_nominal_memory(
    name: str, gib: int, no_cuda: None, capsys: pytest.CaptureFixture[str]
) -> None:
    _code, out = _plan_json(capsys, SINGLE_GPU, "--gpu", name.upper())  # names are case-insensitive
    assert out["capacity"]["device"] == "gpu" and out["plan"]["device"] == "gpu"
    assert out["capacity"]["device_bytes"] == gib * GiB
    assert out["capacity"]["source"].startswith(f"named GPU {name}, nominal {gib} GiB")


def test_gpu_implies_a_gpu_plan_of_a_cpu_config(capsys: pytest.CaptureFixture[str]) -> None:
    _code, out = _plan_json(capsys, SINGLE_CPU, "--gpu", "t4")
    assert out["plan"]["device"] == "gpu" and out["capacity"]["device_bytes"] == 16 * GiB
    assert main(["plan", SINGLE_CPU, "--gpu", "t4", "--device", "gpu"]) == 0
    capsys.readouterr()
    assert main(["plan", SINGLE_CPU, "--gpu", "t4", "--device", "cpu"]) == 2
    assert "drop --device cpu" in capsys.readouterr().err


def test_a_plan_that_does_not_fit_a_named_gpu_proposes_changes(
    qwen_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _plan_json(capsys, SINGLE_GPU, f"model.path={qwen_folder}", "--gpu", "t4")
    peak = out["plan"]["peak_device_bytes"]
    assert (code == 3) == (peak > 0.9 * 16 * GiB)
    code, out = _plan_json(capsys, SINGLE_GPU, f"model.path={qwen_folder}", "--gpu", "h200")
    assert out["plan"]["peak_device_bytes"] == peak  # the plan does not depend on the card
    assert out["fits"] is (peak <= 0.9 * 141 * GiB)


def test_an_unknown_gpu_name_lists_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", SINGLE_GPU, "--gpu", "h300"]) == 2
    err = capsys.readouterr().err
    assert "unknown GPU 'h300'" in err
    for name, gib in NOMINAL.items():
        assert f"{name} ({gib} GiB)" in err


def test_gpu_and_memory_gib_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["plan", SINGLE_GPU, "--gpu", "h100", "--memory-gib", "40"])
    assert exit_.value.code == 2
    assert "not allowed with argument --gpu" in capsys.readouterr().err


def test_a_gpu_plan_without_cuda_says_how_to_give_the_memory(
    no_cuda: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", SINGLE_GPU]) == 2
    err = capsys.readouterr().err
    assert "no CUDA device here; pass --gpu h100 or --memory-gib N to plan for a GPU you will run on" in err
    for name in NOMINAL:
        assert name in err
    assert main(["plan", SINGLE_GPU, "--memory-gib", "24"]) == 0  # either way out works
    assert main(["plan", SINGLE_GPU, "--gpu", "l4"]) == 0
