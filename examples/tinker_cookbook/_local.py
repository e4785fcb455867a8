"""What every script here does before it calls a tinker-cookbook entry point: run it offline and local.

The cookbook's recipes assume the hosted service and the Hugging Face hub. Three of their habits are turned
to local ones here, each through the cookbook's own public hooks (its code stays unchanged):

- the tokenizer: the cookbook loads it with `tinker_cookbook.tokenizer_utils.get_tokenizer(model_name)`,
  which asks the hub for a name it does not know. `register_tokenizer` points the served model name at the
  local folder (the one `quartet serve tinker --model NAME=FOLDER` serves).
- the price list: `supervised.train` and `rl.train` fetch a pricing file from the hosted service's site on
  their first step. `load_model_pricing(url=...)` keeps the first file it read for the whole process, so
  reading a local file first means nothing is fetched.
- the hub: `HF_HUB_OFFLINE` and `HF_DATASETS_OFFLINE`, so that a stray download fails at once instead of
  waiting on a network this machine does not have.

The service's address goes in the recipe's own `base_url` and the key in `TINKER_API_KEY` (the SDK's
variable; it must start with `tml-`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

__all__ = ["add_service_args", "go_local"]

# Set on import, before the hub's client reads them (it reads them once, when it is first imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def add_service_args(parser: argparse.ArgumentParser) -> None:
    """The options every script here takes: where the service is and which model and tokenizer it serves."""
    parser.add_argument("--base-url", required=True, help="the service, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model-name", required=True, help="a base model name the service serves")
    parser.add_argument("--tokenizer", required=True, type=Path, help="the local folder of its tokenizer")
    parser.add_argument("--log-path", required=True, type=Path, help="the run folder (must not exist)")
    parser.add_argument("--api-key", default=None, help="the service's key (default: $TINKER_API_KEY)")
    parser.add_argument(
        "--renderer",
        default="qwen3_instruct",
        help="the cookbook's renderer of the model's chat format (qwen3_instruct: ChatML, the tiny model's)",
    )


def go_local(args: argparse.Namespace) -> None:
    """Make the cookbook offline and local for this process (the module docstring says what and why).

    Call before anything of `tinker_cookbook` runs. Exits with a message when the run folder exists.
    """
    if args.api_key:
        os.environ["TINKER_API_KEY"] = args.api_key
    if args.log_path.exists():  # the recipes would ask on stdin whether to delete it
        sys.exit(f"{args.log_path} exists: give a new --log-path")

    from tinker_cookbook.tokenizer_utils import register_tokenizer
    from tinker_cookbook.utils.cost_estimation import load_model_pricing
    from transformers import AutoTokenizer

    folder = str(args.tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    register_tokenizer(args.model_name, lambda: tokenizer)
    register_tokenizer(folder, lambda: tokenizer)

    with tempfile.TemporaryDirectory() as tmp:  # no price listed: the run logs token counts only
        prices = Path(tmp) / "pricing.json"
        prices.write_text(json.dumps([]))
        load_model_pricing(url=prices.as_uri())
