"""Load models and tokenizers from local folders only.

quartet never downloads: every loader passes `local_files_only=True` and first checks that the folder holds
a `config.json`, so a hub id or a typo fails at once with the path it looked at.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

if TYPE_CHECKING:  # the model classes are imported where a model is loaded: a driver loads only tokenizers
    from transformers import PreTrainedModel

__all__ = [
    "ModelFolderError",
    "is_vision_model",
    "load_causal_lm",
    "load_image_processor",
    "load_tokenizer",
    "load_value_model",
]


class ModelFolderError(FileNotFoundError):
    """A model or tokenizer path that is not a usable local folder."""


def _check_folder(path: str | Path, needs: str) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelFolderError(
            f"model path '{path}' is not a local folder (resolved to {folder.resolve()}); quartet does not "
            "download from a hub: save the model with save_pretrained() and pass that folder"
        )
    if not (folder / needs).exists():
        present = sorted(p.name for p in folder.iterdir())[:20]
        raise ModelFolderError(f"'{folder}' has no {needs}; it holds {present}")
    return folder


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer saved in `path`; left padding (prompts are left-padded in a Batch)."""
    folder = _check_folder(path, "tokenizer_config.json")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True, padding_side="left")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def is_vision_model(path: str | Path) -> bool:
    """True when the folder's `config.json` describes a vision-language model (it has a `vision_config`)."""
    config = Path(path).expanduser() / "config.json"
    if not config.exists():
        return False
    try:
        return "vision_config" in json.loads(config.read_text())
    except (json.JSONDecodeError, OSError):
        return False


def load_causal_lm(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The causal LM saved in `path`, with weights in `dtype`; a vision-language model (Qwen2-VL, ...) is
    loaded as transformers' image-text-to-text model, which generates text as a causal LM does."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    folder = _check_folder(path, "config.json")
    if is_vision_model(folder):
        vlm: PreTrainedModel = AutoModelForImageTextToText.from_pretrained(
            folder, dtype=dtype, local_files_only=True
        )
        return vlm
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True)


def load_image_processor(path: str | Path, min_pixels: int = 0, max_pixels: int = 0) -> Any:
    """The image processor saved in `path` (`preprocessor_config.json`), with the pixel bounds an image is
    resized into overridden where given (> 0): Qwen2-VL's `min_pixels` / `max_pixels`."""
    from transformers import AutoImageProcessor

    folder = _check_folder(path, "preprocessor_config.json")
    kwargs = {k: v for k, v in (("min_pixels", min_pixels), ("max_pixels", max_pixels)) if v > 0}
    return AutoImageProcessor.from_pretrained(  # type: ignore[no-untyped-call]  # unannotated in transformers
        folder, local_files_only=True, **kwargs
    )


def load_value_model(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """A value model (one scalar per token) from `path`.

    `path` may hold a saved value model, or a causal LM whose trunk starts a new value head (the usual way a
    critic is initialised from the policy). A vision-language folder (Qwen2-VL, Qwen2.5-VL) gets the
    multimodal trunk with the same head (`models.vision_value`).
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    folder = _check_folder(path, "config.json")
    config = AutoConfig.from_pretrained(folder, num_labels=1, local_files_only=True)
    config.classifier_dropout = 0.0  # a value regression target should not be noised
    if is_vision_model(folder):
        from quartet.models.vision_value import value_model_class  # loads transformers' VLM modules (~0.3 s)

        cls = value_model_class(config.model_type)
        vlm: PreTrainedModel = cls.from_pretrained(folder, config=config, dtype=dtype, local_files_only=True)
        return vlm
    model: PreTrainedModel = AutoModelForTokenClassification.from_pretrained(
        folder, config=config, dtype=dtype, local_files_only=True
    )
    return model
